"""The App Home tab and ``/opsloop pending``: what a pending approval's line says, within
Slack's limits (pure rendering, no Slack)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from bot import limits
from bot import mrkdwn as md
from bot.mrkdwn import slack_len
from bot.render import home

NOW = datetime(2026, 1, 2, 9, 30, tzinfo=UTC)
ASKED = NOW - timedelta(minutes=12)
LINK = "https://acme.slack.com/archives/C0OPS00001/p1796149721784797"
ALICE, BOB = "U0ALICE01", "U0BOB0001"


def row(**kw: Any) -> home.ThreadRow:
    fields: dict[str, Any] = {
        "thread_id": "thr_1",
        "channel": "C0OPS00001",
        "root_ts": "1796149721.784797",
        "status": "awaiting_approval",
        "requester": ALICE,
        "updated_at": NOW,
        "link": LINK,
        "tool": "deploy",
        "arguments": {"service": "api", "environment": "production"},
        "requested_at": ASKED,
    }
    return home.ThreadRow(**(fields | kw))


def test_a_pending_line_says_where_what_who_and_when() -> None:
    """Issue 8 item 10: not "thread 1796149721.784797 · waiting for approval: deploy".
    Issue 15 §12: its time reads as the cards' do ("today at 2:19 AM"), not "{ago}",
    which a client that cannot show it renders as "2026-01-02 09:18 UTC"."""
    line = home.row_line(row())
    assert line.startswith("• <#C0OPS00001> · waiting for approval: *deploy* ")
    assert "`service=api environment=production`" in line
    assert f"asked by <@{ALICE}> {md.date(ASKED)} · " in line
    assert "{ago}" not in line
    assert line.endswith(f"<{LINK}|open thread>")
    assert "thread 1796149721" not in line


def test_a_row_built_as_before_still_renders() -> None:
    """bot/app.py builds rows without the new fields: they default."""
    old = home.ThreadRow(
        thread_id="thr_1",
        channel="C0OPS00001",
        root_ts="1796149721.784797",
        status="awaiting_approval",
        requester=ALICE,
        updated_at=NOW,
        link=None,
        tool="deploy",
    )
    line = home.row_line(old)
    assert "*deploy* ·" in line and md.date(NOW) in line  # when: the row's last change
    assert line.endswith("`opsloop trace C0OPS00001/1796149721.784797`")


def test_threads_without_a_call_show_their_status_and_last_change() -> None:
    line = home.row_line(row(status="running", tool=None, arguments=None, requested_at=None))
    assert line.startswith("• <#C0OPS00001> · working · asked by ")
    assert "{date_short_pretty}" in line
    assert "a direct message" in home.row_line(row(channel="D0DM000001"))


def test_arguments_are_escaped_bounded_and_cannot_break_the_code_span() -> None:
    evil = {
        "service": "<!channel> & `rm -rf`",
        "note": "x" * 5000,
        "count": 3,
        "flags": ["a", "b"],
        "extra": 1,
    }
    line = home.row_line(row(arguments=evil))
    [summary] = re.findall(r"`([^`]*)`", line)
    assert summary.startswith("service=&lt;!channel&gt; &amp; ˋrm -rfˋ note=xxx")
    assert "<!channel>" not in line
    assert 'flags=["a", "b"]' not in summary or "…" in summary  # cut to its budget
    assert slack_len(summary) <= home.ARGUMENTS_CHARS * 5  # escaped, from a bounded cut
    assert "extra" not in summary  # the first few pairs only


def test_a_link_that_is_not_a_plain_https_url_is_not_used() -> None:
    line = home.row_line(row(link="javascript:alert(1)|x>"))
    assert "javascript" not in line and "opsloop trace C0OPS00001/" in line


def test_home_and_pending_lists_keep_slacks_limits_with_many_huge_rows() -> None:
    huge = {f"k{i}": "<&>" * 2000 for i in range(50)}
    rows = [row(tool="t" * 500, arguments=huge, requester=f"U{i:09d}") for i in range(60)]
    view = home.home_view(BOB, rows, rows)
    assert limits.check_limits(view) == []
    text = home.pending_text(rows)
    assert slack_len(text) <= limits.MAX_TEXT
    assert re.search(r"…and [0-9]+ more \(`opsloop threads`", text)  # whole lines, counted
    small = [row(requester=f"U{i:09d}") for i in range(60)]
    listed = home.pending_text(small)
    [more] = re.findall(r"…and ([0-9]+) more", listed)
    assert listed.count("\n• ") + int(more) == 60 and listed.count("\n• ") >= 10
    assert slack_len(listed) <= limits.MAX_TEXT
