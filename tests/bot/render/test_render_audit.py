"""``/opsloop audit``'s answer and the Home tab's "Decided by me": what they say, and
that long or hostile logs stay within Slack's limits (pure rendering, no Slack)."""

from __future__ import annotations

import re
from datetime import timedelta

from bot import limits
from bot.mrkdwn import slack_len
from bot.render import home
from bot.render.audit import MAX_CALLS, audit_blocks, audit_text
from engine import events as ev
from engine.audit import audit
from tests.bot.render.support import (
    EVIL,
    HASH,
    LATER,
    NOW,
    REQUESTER,
    REVIEWER,
    THREAD,
    all_text,
    assert_safe,
    audited_log,
    requested,
    sdk_validate,
    text_objects,
)

LINK = "https://acme.slack.com/archives/C0OPS00001/p1796149721784797"
ENV = {"thread_id": THREAD}


def asked(call_id: str, arguments: dict | None = None) -> list[ev.Event]:
    return [
        requested("deploy", arguments or {"env": "staging"}, tool_call_id=call_id),
        ev.ApprovalRequested(**ENV, tool_call_id=call_id, arguments_hash=HASH, expires_at=LATER),
    ]


def rendered(log: list[ev.Event], link: str | None = LINK) -> list[dict]:
    blocks = audit_blocks(thread_id=THREAD, link=link, calls=audit(log))
    assert limits.check_limits(blocks) == []
    sdk_validate(blocks)
    return blocks


def test_each_call_says_who_asked_the_rule_every_step_and_what_came_of_it() -> None:
    blocks = rendered(audited_log("plain words", "deploy", {"env": "staging"}))
    text = all_text(blocks)
    assert text.startswith(f"*Approvals in <{LINK}|this thread>* · `opsloop trace {THREAD}`")
    first = all_text([blocks[1]])
    assert first.startswith(f"*1.* *deploy* asked by <@{REQUESTER}> <!date^")
    assert "📜 rule 3: needs 3 of " in first and "<!subteam^S0GROUP01>" in first
    assert 'Arguments: `{"env":"staging"}`' in first
    assert f"✅ approved by <@{REVIEWER}> " in first
    assert "🚫 Uplain words tried to approve " in first and ", refused: plain words" in first
    assert "✅ approved by grant `plain words` " in first
    assert "*Result:* ✅ ran <!date^" in first and '`{"o":"plain words"}`' in first
    assert f"❌ rejected by <@{REVIEWER}> " in text and "*Result:* ❌ rejected; never ran" in text
    assert "↩️ withdrawn " in text and "⌛ expired " in text
    assert "📜 rule 2 refuses it: plain words" in text
    assert "❓ outcome unknown " in text and f"🧾 <@{REVIEWER}> said it happened " in text
    assert "*Result:* ✅ it happened, a person said" in text
    assert "*Result:* ❌ failed" in text and "🛑 cancelled by" in text
    last = all_text([blocks[-2]])
    assert f"✏️ edited by <@{REVIEWER}> " in last
    assert "env: `staging` → (unset)" in last and "plain words: (unset) → `plain words`" in last
    assert 'Ran with (edited): `{"plain words":"plain words"' in last
    assert "🔔 approvers reminded" in last
    assert "*Result:* ⏳ waiting for approval: 0 of 1, expires <!date^" in last
    assert "Calls that ran without approval are in" in all_text([blocks[-1]])


def test_a_withdrawal_names_the_requester_as_a_mention_and_nobody_else() -> None:
    why = f"superseded by a newer message from <@{REQUESTER}> cc <@U999> <!channel>"
    log: list[ev.Event] = [ev.UserMessage(**ENV, actor=REQUESTER, text="deploy")]
    log += [
        *asked("toolu_1"),
        ev.ApprovalWithdrawn(**ENV, actor=REQUESTER, tool_call_id="toolu_1", reason=why),
    ]
    text = all_text(rendered(log, link=None))
    assert f"from <@{REQUESTER}> cc &lt;@U999&gt; &lt;!channel&gt;" in text
    assert_safe(text)


def test_a_thread_without_approvals_says_so() -> None:
    log: list[ev.Event] = [ev.UserMessage(**ENV, actor=REQUESTER, text="hi")]
    [block] = rendered(log)
    assert "No call in this thread needed anyone's approval." in all_text([block])
    assert audit_text([]) == "No call in this thread needed anyone's approval."


def test_many_calls_show_the_latest_and_count_the_earlier_ones() -> None:
    log: list[ev.Event] = [ev.UserMessage(**ENV, actor=REQUESTER, text="go")]
    for i in range(60):
        log += [
            *asked(f"toolu_{i:03d}", arguments={"blob": "<&>" * 5000}),
            ev.ApprovalRejected(**ENV, actor=REVIEWER, tool_call_id=f"toolu_{i:03d}", reason="x"),
        ]
    blocks = rendered(log)
    assert len(blocks) == MAX_CALLS + 3
    assert "…and 40 earlier calls" in all_text([blocks[1]])
    assert all_text([blocks[2]]).startswith("*41.* ")
    assert all_text([blocks[-2]]).startswith("*60.* ")
    assert slack_len(audit_text(audit(log))) <= 3000


def test_a_call_with_endless_refused_clicks_is_cut_with_and_n_more_and_keeps_its_result() -> None:
    log: list[ev.Event] = [ev.UserMessage(**ENV, actor=REQUESTER, text="go")]
    log += asked("toolu_1", arguments={"note": "x" * 100_000})
    log += [
        ev.ApprovalRefused(
            **ENV,
            actor="U0EVE00001",
            tool_call_id="toolu_1",
            decision="approve",
            reason="<!channel> " * 100,
            created_at=NOW + timedelta(seconds=i),
        )
        for i in range(500)
    ]
    log.append(ev.ApprovalGranted(**ENV, actor=REVIEWER, tool_call_id="toolu_1"))
    [_, call, _] = rendered(log)
    text = all_text([call])
    assert slack_len(text) <= limits.MAX_TEXT
    [more] = re.findall(r"• …and ([0-9]+) more: `opsloop trace", text)
    assert text.count("\n• 🚫") + int(more) == 501  # 500 refusals and the vote, counted
    assert "*Result:* ▶️ approved; not started yet" in text
    assert "<!channel>" not in text


def test_decided_by_me_lines_say_what_on_which_tool_where_and_when() -> None:
    rows = [
        home.DecisionRow("approved", "deploy", THREAD, "C0OPS00001", "1.2", NOW, LINK),
        home.DecisionRow("rejected", None, THREAD, "D0DM000001", "1.3", NOW),
        home.DecisionRow("happened", "restart", THREAD, "C0OPS00001", "1.4", NOW),
    ]
    view = home.home_view(REVIEWER, [], [], rows)
    assert limits.check_limits(view) == []
    [section] = [t for t in text_objects(view) if t.startswith("*Decided by me*")]
    assert f"• ✅ approved *deploy* · <#C0OPS00001> · <!date^{int(NOW.timestamp())}^" in section
    assert f"<{LINK}|open thread>" in section
    assert "• ❌ rejected a call · a direct message · " in section
    assert "`opsloop trace D0DM000001/1.3`" in section
    assert "• 🧾 said it happened: *restart* · " in section
    empty = all_text(home.home_view(REVIEWER, [], [])["blocks"])
    assert "*Decided by me*\nYou have not decided anything yet." in empty


def test_decided_by_me_keeps_slacks_limits_with_huge_tool_names() -> None:
    rows = [
        home.DecisionRow("approved", EVIL * 200, THREAD, "C0OPS00001", "1.2", NOW, LINK)
        for _ in range(20)
    ]
    view = home.home_view(REVIEWER, [], [], rows)
    assert limits.check_limits(view) == []
    text = home.decision_lines(rows, "none")
    assert slack_len(text) <= limits.MAX_TEXT and "<!channel>" not in text
