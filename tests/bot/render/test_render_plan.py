"""The thread as a live plan: runs cut from the log, their task cards as stream chunks
and as Block Kit, the answer as safe markdown, and the feedback row."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from slack_sdk.models.blocks import Block as SdkBlock
from slack_sdk.models.messages.chunk import Chunk

from bot import mrkdwn as md
from bot.limits import MAX_MESSAGE_BLOCKS
from bot.render import plan
from bot.render.markdown import MAX_MARKDOWN
from bot.render.plan import (
    FEEDBACK_ACTION,
    MAX_PLAN_TASKS,
    answer_text,
    bare,
    chunks_since,
    feedback_blocks,
    note_shown,
    parse_feedback_block,
    plan_blocks,
    plan_chunks,
    runs,
)
from bot.render.runs import request_words
from bot.render.tasks import MAX_TASK_TEXT, MAX_TITLE, progress_note, sources_of, titled
from engine import events as ev
from tests.bot.render.plan_support import (
    EVIL,
    NOW,
    OTHER,
    REQUESTER,
    REVIEWER,
    THREAD,
    Log,
)

RAW_TOKENS = ("<!channel>", "<@U999>", "<https://evil", "<!here>")
OUR_MENTION = re.compile(r"<@U0(?:REQUEST1|REVIEW01|REVIEW02)>")


def tasks(run: plan.Run, done: bool = False, **kw: Any) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in plan_chunks(run, done=done, **kw) if c["type"] == "task_update"}


def only(log: Log) -> plan.Run:
    cut = runs(log.events)
    assert len(cut) == 1, [r.title for r in cut]
    return cut[0]


def assert_sdk_chunks(chunks: list[dict[str, Any]]) -> None:
    """slack_sdk's chunk models send exactly these dicts."""
    for chunk in chunks:
        parsed = Chunk.parse(chunk)
        assert parsed is not None and parsed.to_dict() == chunk


def assert_untrusted_text_is_inert(text: str) -> None:
    """Only our mentions are tokens; no raw token, no markdown link, no broadcast."""
    rest = OUR_MENTION.sub("", text)
    assert "<" not in rest and ">" not in rest, text
    assert not re.search(r"&(?!amp;|lt;|gt;)", rest), text
    assert "](" not in rest and "@here" not in rest and "@channel" not in rest, text


# --- cutting runs ---------------------------------------------------------------------


def test_a_request_answered_after_tools_is_one_ended_run() -> None:
    log = Log().ask().run_tool("toolu_1").run_tool("toolu_2", intent="list_pods").answer()
    run = only(log)
    assert run.start is log.events[0] and run.events == tuple(log.events)
    assert run.ended and run.stop is log.events[-1]
    assert run.title == "check api's health"
    assert list(tasks(run)) == ["toolu_1", "toolu_2"]


def test_an_open_run_is_not_ended_and_has_no_answer() -> None:
    run = only(Log().ask().call().start())
    assert not run.ended and run.stop is None
    assert answer_text(run) == ""


def test_an_approval_splits_the_work_into_a_run_below_its_card() -> None:
    log = Log().ask("restart api please").run_tool("toolu_0")
    log.card("toolu_1", approvers=(REVIEWER, OTHER), quorum=2)
    log.approve("toolu_1", REVIEWER)  # one vote of two: the thread still waits
    first, *rest = runs(log.events)
    assert first.ended and isinstance(first.stop, ev.ApprovalRequested) and rest == []
    assert first.events[-1].type == "approval_granted"  # a vote short of a quorum stays
    card = tasks(first)["toolu_1"]
    assert card["status"] == "pending" and card["details"] == "service: api"
    # What changes while the card shows is in its title (Slack replaces titles).
    assert (
        card["title"] == "Check health (service: api) — waiting for approval — see the card below"
    )

    log.approve("toolu_1", OTHER).start("toolu_1").result("toolu_1", "restarted").answer()
    first, second = runs(log.events)
    assert isinstance(second.start, ev.ApprovalGranted) and second.start.actor == OTHER
    assert second.title == "Approved: Check health (service: api)"
    assert [e.type for e in second.earlier] == ["tool_call_requested", "approval_granted"]
    card = tasks(second, done=True)["toolu_1"]  # the same call, a card in the new plan
    assert card["status"] == "complete" and card["output"] == "restarted"
    assert card["details"] == f"service: api\napproved by <@{REVIEWER}> and <@{OTHER}>"
    assert "toolu_0" not in tasks(second)


def test_a_standing_grant_approves_within_the_run() -> None:
    log = Log().ask().call("toolu_1", policy="approve_before_run", max_grant_s=3600.0)
    log.add(
        ev.GrantCreated(
            actor=REVIEWER,
            grant_id="g1",
            tool="check_health",
            arguments_schema={},
            until=NOW + timedelta(hours=2),
            reviewer=REVIEWER,
        )
    )
    log.add(ev.ApprovalGranted(actor="grant:g1", tool_call_id="toolu_1"))
    run = only(log.start().result().answer())
    assert tasks(run)["toolu_1"]["details"] == "service: api\napproved by a standing grant"


def test_a_message_from_someone_else_while_a_card_waits_starts_no_run() -> None:
    log = Log().ask().card("toolu_1").ask("any news?", user=OTHER)
    assert len(runs(log.events)) == 1


def test_the_requester_writing_again_withdraws_the_card_and_starts_a_run() -> None:
    log = Log().ask().card("toolu_1")
    log.add(ev.ApprovalWithdrawn(actor=REQUESTER, tool_call_id="toolu_1", reason="x"))
    log.ask("actually, just look at the db. Thanks!")
    _, second = runs(log.events)
    assert isinstance(second.start, ev.ApprovalWithdrawn)
    assert second.title == "actually, just look at the db"
    card = tasks(second, done=True)["toolu_1"]
    assert card["status"] == "error"
    assert card["output"] == f"withdrawn: <@{REQUESTER}> wrote again"


@pytest.mark.parametrize(
    ("closing", "status", "output"),
    [
        (
            ev.ApprovalRejected(actor=REVIEWER, tool_call_id="toolu_1", reason="not now"),
            "error",
            f"rejected by <@{REVIEWER}>: not now",
        ),
        (ev.ApprovalExpired(tool_call_id="toolu_1"), "error", "nobody approved it in time"),
    ],
    ids=["rejected", "expired"],
)
def test_a_closed_card_starts_a_run_where_the_call_ended(
    closing: ev.Event, status: str, output: str
) -> None:
    log = Log().ask().card("toolu_1").add(closing).answer("OK, I left it.")
    _, second = runs(log.events)
    assert second.start.type == closing.type
    card = tasks(second)["toolu_1"]
    assert (card["status"], card["output"]) == (status, output)
    assert answer_text(second) == "OK, I left it."


def test_a_stop_ends_the_run_and_the_plan_says_who_stopped_it() -> None:
    log = Log().ask().run_tool("toolu_1").call("toolu_2").stop(OTHER)
    run = only(log)
    assert run.ended and isinstance(run.stop, ev.StopRequested) and run.stopped_by == OTHER
    assert answer_text(run) == f"⏹️ Stopped by <@{OTHER}>."
    card = tasks(run, done=True)["toolu_2"]  # requested, never started
    assert (card["status"], card["output"]) == ("error", f"not run: stopped by <@{OTHER}>")
    assert tasks(run, done=False)["toolu_2"]["status"] == "pending"
    # A stop is no start: the next message is.
    log.ask("try again", user=REQUESTER)
    assert [r.title for r in runs(log.events)] == ["check api's health", "try again"]


def test_a_stop_lets_a_started_tool_end_by_its_normal_path() -> None:
    log = Log().ask().call("toolu_1").start("toolu_1").stop()
    assert not only(log).ended  # the tool is still running
    log.result("toolu_1", "done anyway")
    run = only(log)
    assert run.ended and run.stop is log.events[-1]
    assert tasks(run, done=True)["toolu_1"]["status"] == "complete"
    assert answer_text(run) == f"⏹️ Stopped by <@{REQUESTER}>."


def test_a_retry_is_the_same_card_in_the_same_run() -> None:
    log = Log().ask().call().start()
    log.add(
        ev.RetryScheduled(
            tool_call_id="toolu_1",
            attempt=1,
            error="timeout",
            wake_at=NOW + timedelta(seconds=log.last_seq + 1 + 4),
        )
    )
    card = tasks(only(log), max_attempts=3)["toolu_1"]
    assert card["status"] == "in_progress" and card["details"] == "service: api"
    words = "Check health (service: api)"
    assert card["title"] == f"{words} — attempt 1 failed: timeout; attempt 2 of 3 in 4 s"
    log.start(attempt=2)
    card = tasks(only(log), max_attempts=3)["toolu_1"]
    assert (card["status"], card["title"]) == ("in_progress", f"{words} — attempt 2 of 3")
    log.result(attempt=2).answer()
    card = tasks(only(log))["toolu_1"]
    assert card["status"] == "complete" and card["title"] == words
    assert card["details"] == "service: api"


def test_a_reconcile_retry_runs_the_call_again_in_a_new_run() -> None:
    log = Log().ask().call("toolu_1", intent="charge_card", idempotent=False).start()
    log.add(ev.ToolOutcomeUnknown(tool_call_id="toolu_1", attempt=1, error="connection lost"))
    (first,) = runs(log.events)
    assert first.ended and isinstance(first.stop, ev.ToolOutcomeUnknown)
    card = tasks(first)["toolu_1"]
    assert (card["status"], card["output"]) == ("error", "outcome unknown — see the card below")

    log.add(
        ev.ReconcileDecided(
            actor=REVIEWER, tool_call_id="toolu_1", decision="retry", reviewer=REVIEWER
        )
    )
    first, second = runs(log.events)
    assert isinstance(second.start, ev.ReconcileDecided)
    assert second.title == "Continuing: check api's health"
    card = tasks(second)["toolu_1"]
    assert card["status"] == "pending" and card["title"] == "Charge card (service: api)"
    assert card["details"] == f"service: api\n<@{REVIEWER}> said to run it again"
    log.start(attempt=2).result(attempt=2, output="charged")
    assert tasks(runs(log.events)[1])["toolu_1"]["status"] == "complete"


def test_waits_questions_and_new_messages_start_runs() -> None:
    log = Log().ask("deploy api").call("toolu_1", intent="deploy", policy="wait_for_external_event")
    log.start()
    log.add(
        ev.WaitStarted(
            tool_call_id="toolu_1",
            wait_id="w1",
            description="deploy job 42",
            wake_at=NOW,
            timeout_at=NOW + timedelta(hours=1),
        )
    )
    log.add(
        ev.WaitFinished(
            tool_call_id="toolu_1",
            wait_id="w1",
            result={"status": "deployed", "url": "https://ci.example.com/42"},
        )
    )
    log.add(
        ev.ModelDecision(tool_name="request_clarification", tool_call_id="toolu_q"),
        ev.ClarificationRequested(tool_call_id="toolu_q", question="Also staging?"),
    )
    log.add(ev.ClarificationAnswered(actor=REQUESTER, tool_call_id="toolu_q", text="no"))
    log.answer("Deployed.").ask("<@U0BOT0001> now restart <@U0REVIEW01>", source={"kind": "slack"})
    cut = runs(log.events, bot_user_id="U0BOT0001")
    assert [r.title for r in cut] == [
        "deploy api",
        "Continuing: deploy api",
        "Continuing: deploy api",
        "now restart @U0REVIEW01",
    ]
    assert [type(r.stop).__name__ for r in cut] == [
        "WaitStarted",
        "ClarificationRequested",
        "FinalAnswer",
        "NoneType",
    ]
    waited = tasks(cut[0])["toolu_1"]
    assert (waited["status"], waited["details"], waited["title"]) == (
        "in_progress",
        "service: api",
        "Deploy (service: api) — waiting for deploy job 42",
    )
    done = tasks(cut[1])["toolu_1"]
    assert done["status"] == "complete" and done["output"].startswith("status: deployed")
    assert done["sources"] == [
        {"type": "url", "url": "https://ci.example.com/42", "text": "ci.example.com/42"}
    ]
    assert answer_text(cut[1]) == f"❓ <@{REQUESTER}> Also staging?"


def test_an_alert_starts_a_run_titled_by_its_summary() -> None:
    log = Log().add(
        ev.AlertReceived(
            actor="alert:generic",
            source="generic",
            fingerprint="f1",
            status="firing",
            summary="API p99 latency above 2s. Runbook",
        )
    )
    assert only(log).title == "API p99 latency above 2s"


def test_a_run_as_it_stood_at_an_earlier_event() -> None:
    log = Log().ask().call().start()
    seen = log.last_seq
    log.result().answer()
    run = only(log)
    before = run.until(seen)
    assert not before.ended and before.events == tuple(log.events[:seen])
    assert tasks(before)["toolu_1"]["status"] == "in_progress"
    assert tasks(run)["toolu_1"]["status"] == "complete"


@pytest.mark.parametrize(
    ("text", "source", "words"),
    [
        ("Restart api. Then tell me.", None, "Restart api"),
        (
            "\n\n  why is <@U2|bob> paged?\nmore",
            {"kind": "slack", "names": {"U2": "al"}},
            "why is @al paged?",
        ),
        (
            "a &lt;b&gt; &amp; <#C1|ops> <https://x.example|docs>",
            {"kind": "slack"},
            "a <b> & #ops docs (https://x.example)",
        ),
        ("word " * 30, None, "word word word word word word word word word word word…"),
        ("x" * 100, None, "x" * 59 + "…"),
        ("\u202eevil\u202c text", None, "evil text"),
    ],
)
def test_a_request_in_a_few_words(text: str, source: Any, words: str) -> None:
    assert request_words(text, source) == words


def test_a_hostile_request_title_is_escaped() -> None:
    run = only(Log().ask(EVIL * 3))
    assert len(run.title) <= MAX_TITLE
    assert_untrusted_text_is_inert(run.title)
    assert run.title.startswith("&lt;!channel&gt; &lt;@U999&gt;")


# --- task cards -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "status", "output"),
    [
        (lambda g: g.call(), "pending", None),
        (lambda g: g.call().start(), "in_progress", None),
        (lambda g: g.call().start().result(output={"status": "ok"}), "complete", "status: ok"),
        (lambda g: g.call().start().failed(error="exit 1\nstack"), "error", "exit 1 stack"),
        (
            lambda g: g.call(policy="reject", rule=1, reason="prod is frozen"),
            "error",
            "refused by rule 2: prod is frozen",
        ),
        (
            lambda g: (
                g.call(idempotent=False)
                .start()
                .add(ev.ToolOutcomeUnknown(tool_call_id="toolu_1", attempt=1))
            ),
            "error",
            "outcome unknown — see the card below",
        ),
        (
            lambda g: (
                g.call(policy="wait_for_external_event")
                .start()
                .add(
                    ev.WaitStarted(
                        tool_call_id="toolu_1",
                        wait_id="w",
                        description="job",
                        wake_at=NOW,
                        timeout_at=NOW,
                    )
                )
                .add(ev.WaitTimedOut(tool_call_id="toolu_1", wait_id="w"))
            ),
            "error",
            "gave up waiting: it timed out",
        ),
        (lambda g: g.card(), "pending", None),
    ],
    ids=["requested", "started", "result", "error", "refused", "unknown", "timed-out", "card"],
)
def test_every_task_status(build: Any, status: str, output: str | None) -> None:
    log = build(Log().ask())
    chunks = plan_chunks(runs(log.events)[-1], done=False)  # a wait's end is a new run
    assert_sdk_chunks(chunks)
    (card,) = [c for c in chunks if c["type"] == "task_update"]
    assert card["id"] == "toolu_1" and card["status"] == status
    assert card.get("output") == output
    assert card["title"].startswith("Check health (service: api)")


def test_details_never_change_once_shown_so_they_are_sent_once() -> None:
    log = Log().ask().card("toolu_1", arguments={"blob": "<&>" * 200, "n": 3}, quorum=1)
    log.approve().start()
    for attempt in (1, 2, 3):
        log.add(
            ev.RetryScheduled(
                tool_call_id="toolu_1",
                attempt=attempt,
                error=EVIL * 9,
                wake_at=NOW + timedelta(minutes=attempt),
            )
        )
        log.start(attempt=attempt + 1)
    log.result(attempt=4)
    seen: dict[str, str] = {}
    for seq in range(1, log.last_seq + 1):
        for run in runs(log.events[:seq]):
            card = tasks(run).get("toolu_1")
            if card is None:
                continue
            key = f"{run.start.seq}"
            details = card.get("details", "")
            assert details == seen.get(key, details), (seen.get(key), details)
            assert md.slack_len(card["title"]) <= MAX_TITLE
            assert md.slack_len(details) <= MAX_TASK_TEXT
            seen[key] = details
    assert_untrusted_text_is_inert("".join(seen.values()))


def test_a_final_plan_says_what_a_cancellation_left_unfinished() -> None:
    log = (
        Log()
        .ask()
        .call("toolu_1")
        .start()
        .add(ev.ThreadCancelled(actor=REVIEWER, reason="<!channel> wrong thread"))
    )
    run = only(log)
    assert tasks(run, done=False)["toolu_1"]["status"] == "in_progress"
    card = tasks(run, done=True)["toolu_1"]
    assert (card["status"], card["output"]) == ("error", f"unfinished: cancelled by <@{REVIEWER}>")
    assert answer_text(run) == f"🚫 Cancelled by <@{REVIEWER}>: &lt;!channel&gt; wrong thread"


HOSTILE = [
    ("evil", EVIL, {"q": EVIL, EVIL: EVIL}, {"out": EVIL, "url": "https://x.example/<a>"}),
    ("huge", "t" * 300, {"blob": "<&>" * 34_000}, {"rows": [{"n": "ü" * 500}] * 300}),
    ("weird", "\u202e\x00" * 50 + "👩‍👩‍👧‍👦" * 100, {"x": "🇫🇷" * 500}, "e\u0301" * 5000),
    (
        "mcp",
        "mcp__srv__do_it",
        {},
        {"text": EVIL, "structured": {"link": f"https://a.example?{EVIL}"}},
    ),
]


@pytest.mark.parametrize(
    ("intent", "args", "output"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_tool_names_arguments_and_results_are_escaped_and_bounded(
    intent: str, args: dict[str, Any], output: Any
) -> None:
    log = Log().ask().call("toolu_1", intent=intent, arguments=args).start().result(output=output)
    log.call("toolu_2", intent=intent, arguments=args).start("toolu_2")
    log.failed("toolu_2", error=EVIL * 50)
    run = only(log)
    chunks = plan_chunks(run, done=True)
    assert_sdk_chunks(chunks)
    dumped = json.dumps(chunks, ensure_ascii=False)
    for raw in RAW_TOKENS:
        assert raw not in dumped
    for chunk in chunks:
        assert md.slack_len(chunk["title"]) <= MAX_TITLE
        for key in ("details", "output"):
            assert md.slack_len(chunk.get(key, "")) <= MAX_TASK_TEXT
            assert_untrusted_text_is_inert(chunk.get(key, ""))
        assert_untrusted_text_is_inert(chunk["title"])
        for source in chunk.get("sources", []):
            assert re.fullmatch(r"https?://[^\s<>\"]+", source["url"])
            assert_untrusted_text_is_inert(source["text"])
    blocks = plan_blocks(run)
    assert_blocks_within_limits(blocks)


def test_a_result_is_readable_text_never_raw_json() -> None:
    output = {"text": '{"service": "api", "replicas": 6}', "structured": None}
    run = only(Log().ask().run_tool(output={"text": '{"service": "api", "replicas": 6}'}))
    assert tasks(run)["toolu_1"]["output"] == "service: api\nreplicas: 6"
    assert output  # the MCP envelope is dropped, its JSON text parsed


# --- sources ----------------------------------------------------------------------------


def test_sources_are_the_links_of_a_result_once_each_and_bounded() -> None:
    hits = {
        "hits": [
            {"title": "Runbook: API", "url": "https://docs.example.com/runbooks/api"},
            {"name": "Dashboard", "href": "https://grafana.example.com/d/api?from=now-1h"},
            {"title": "dupe", "url": "https://docs.example.com/runbooks/api"},
            {"title": "not a web link", "url": "file:///etc/passwd"},
            {"title": "javascript", "url": "javascript:alert(1)"},
        ],
        "note": "see https://status.example.com/incidents/7. And <https://evil.example|bank>",
    }
    assert sources_of(hits) == (
        ("https://docs.example.com/runbooks/api", "Runbook: API"),
        ("https://grafana.example.com/d/api?from=now-1h", "Dashboard"),
        ("https://status.example.com/incidents/7", "status.example.com/incidents/7"),
        ("https://evil.example", "evil.example"),
    )
    mcp = {
        "text": "found",
        "attachments": [
            {"type": "resource_link", "uri": "https://kb.example.com/a", "name": f"KB {EVIL}"},
            {"type": "image", "mime_type": "image/png"},
        ],
    }
    (source,) = sources_of(mcp)
    assert source.url == "https://kb.example.com/a"
    assert_untrusted_text_is_inert(source.text)
    many = [{"url": f"https://x.example/{i}", "title": str(i)} for i in range(50)]
    assert len(sources_of(many)) == 8
    assert sources_of("x" * 10**6 + " https://late.example") == ()  # only a bounded scan


# --- the answer -----------------------------------------------------------------------


def test_the_answer_is_markdown_that_cannot_ping_or_hide_a_link() -> None:
    text = (
        f"{EVIL}\n> a quote\n\nRun `a && b 2>&1 <@U999>` then:\n"
        "```sh\ncurl -s 'x' > out && echo <!channel>\n```\n[system] done"
    )
    run = only(Log().ask().answer(text))
    shown = answer_text(run)
    assert shown.startswith(
        "&lt;!channel&gt; &lt;@U999&gt; &lt;https://evil.example|bank&gt; &amp; stuff "
        f"[click]{md.ZWSP}(https://evil.example) @{md.ZWSP}here\n> a quote"
    )
    assert f"`a && b 2>&1 <{md.ZWSP}@U999>`" in shown  # code as written, tokens broken
    assert f"```sh\ncurl -s 'x' > out && echo <{md.ZWSP}!channel>\n```" in shown
    assert shown.endswith("\ndone")
    for raw in RAW_TOKENS:
        assert raw not in shown


def test_a_long_answer_is_cut_at_12000_characters_with_a_pointer_to_the_trace() -> None:
    pointer = f"… (cut: see `opsloop trace {THREAD}`)"
    for text in ("word " * 5000, "&" * 20_000, "👩‍👩‍👧‍👦" * 4000, "intro\n```\n" + "<x>\n" * 5000):
        run = only(Log().ask().answer(text))
        shown = answer_text(run)
        assert MAX_MARKDOWN - 200 < md.slack_len(shown) <= MAX_MARKDOWN, text[:10]
        assert shown.endswith(pointer)
        assert not re.search(r"&(?!amp;|lt;|gt;)", shown.replace("&&", ""))
        assert shown.count("```") % 2 == 0  # a fence cut is closed
    short = only(Log().ask().answer("fine"))
    assert answer_text(short) == "fine"


def test_an_error_says_where_to_look() -> None:
    log = Log().ask().add(ev.ErrorRaised(message=EVIL * 2000, kind="tool_*failed"))
    shown = answer_text(only(log))
    assert shown.startswith("⚠️ **tool_∗failed**: &lt;!channel&gt;")
    assert shown.endswith(f"This thread needs a human. Details: `opsloop trace {THREAD}`")
    assert md.slack_len(shown) <= MAX_MARKDOWN
    assert f"… (cut: see `opsloop trace {THREAD}`)" in shown


def test_runs_ending_on_a_card_or_a_wait_have_no_answer_text() -> None:
    assert answer_text(only(Log().ask().card())) == ""


# --- Block Kit --------------------------------------------------------------------------


def assert_blocks_within_limits(blocks: list[dict[str, Any]]) -> None:
    assert len(blocks) + sum(len(b.get("tasks", [])) for b in blocks) <= MAX_MESSAGE_BLOCKS - 1
    for block in blocks:
        parsed = SdkBlock.parse(block)
        assert parsed is not None
        parsed.validate_json()
        assert parsed.to_dict() == block
        if block["type"] == "markdown":
            assert md.slack_len(block["text"]) <= MAX_MARKDOWN
        if block["type"] == "plan":
            assert md.slack_len(block["title"]) <= MAX_TITLE
            for card in block.get("tasks", []):
                assert md.slack_len(card["title"]) <= MAX_TITLE
                for key in ("details", "output"):
                    if key in card:
                        (section,) = card[key]["elements"]
                        kinds = {e["type"] for e in section["elements"]}
                        assert kinds <= {"text", "user"}, kinds
                        assert sum(len(e.get("text", "")) for e in section["elements"]) <= 256


def test_plan_blocks_show_the_whole_plan_within_slacks_limits() -> None:
    log = Log().ask()
    for i in range(60):
        log.run_tool(f"toolu_{i}", output={"blob": EVIL * 100, "url": f"https://x.example/{i}"})
    log.card("toolu_x").approve("toolu_x", REVIEWER).start("toolu_x").result("toolu_x")
    log.answer("word " * 5000)
    first, second = runs(log.events)
    blocks = plan_blocks(first)
    assert_blocks_within_limits(blocks)
    (plan_block,) = blocks
    assert len(plan_block["tasks"]) == MAX_PLAN_TASKS
    assert plan_block["title"].endswith(f"(the latest {MAX_PLAN_TASKS} of 61 steps)")
    assert plan_block["tasks"][-1]["task_id"] == "toolu_x"

    blocks = plan_blocks(second)
    assert_blocks_within_limits(blocks)
    card = blocks[0]["tasks"][0]
    assert card["details"]["elements"][0]["elements"] == [
        {"type": "text", "text": "service: api\napproved by "},
        {"type": "user", "user_id": REVIEWER},
    ]
    assert blocks[1]["type"] == "markdown" and blocks[1]["text"].endswith(
        f"(cut: see `opsloop trace {THREAD}`)"
    )


def test_rich_text_shows_untrusted_text_literally() -> None:
    run = only(Log().ask().run_tool(output=EVIL))
    card = plan_blocks(run)[0]["tasks"][0]
    (text,) = card["output"]["elements"][0]["elements"]
    # rich text makes no token of text: it shows what the tool said.
    assert text == {
        "type": "text",
        "text": EVIL.replace("]", f"]{md.ZWSP}").replace("@here", f"@{md.ZWSP}here"),
    }


# --- streaming only what is new ---------------------------------------------------------


def test_chunks_since_sends_details_and_output_once_and_titles_as_they_change() -> None:
    log = Log().ask().call()
    sent = plan_chunks(only(log), done=False)
    shown: plan.Shown = {}
    assert chunks_since(shown, sent) == sent
    note_shown(shown, sent)
    assert chunks_since(shown, sent) == []
    log.start()
    log.add(
        ev.RetryScheduled(
            tool_call_id="toolu_1",
            attempt=1,
            error="timeout",
            wake_at=NOW + timedelta(seconds=log.last_seq + 5),
        )
    )
    now = plan_chunks(only(log), done=False)
    assert chunks_since(shown, now) == [
        {
            "type": "task_update",
            "id": "toolu_1",
            "title": "Check health (service: api) — attempt 1 failed: timeout; attempt 2 in 4 s",
            "status": "in_progress",
        }
    ]
    note_shown(shown, chunks_since(shown, now))
    log.start(attempt=2).result(attempt=2, output="https://a.example").call("toolu_2")
    later = plan_chunks(only(log), done=False)
    delta = chunks_since(shown, later)
    assert [(c["id"], c["status"]) for c in delta] == [
        ("toolu_1", "complete"),
        ("toolu_2", "pending"),
    ]
    assert delta[0]["output"] == "https://a.example" and "details" not in delta[0]
    assert delta[0]["sources"] == [{"type": "url", "url": "https://a.example", "text": "a.example"}]
    assert delta[1]["details"] == "service: api"  # a new card: all of it
    assert_sdk_chunks(delta)
    note_shown(shown, delta)
    # Said once: a card that has its output never names it (or its details) again.
    assert chunks_since(shown, later) == []
    assert all(
        not set(c) & {"details", "output", "sources"} for c in chunks_since(shown, bare(later))
    )


def test_after_a_restart_only_titles_and_statuses_are_sent() -> None:
    log = Log().ask().run_tool("toolu_1").call("toolu_2")
    chunks = plan_chunks(only(log), done=False)
    assert [set(c) for c in bare(chunks)] == [
        {"type", "title"},
        {"type", "id", "title", "status"},
        {"type", "id", "title", "status"},
    ]
    assert_sdk_chunks(bare(chunks))


def test_progress_shows_in_the_title_within_its_limit() -> None:
    assert progress_note(2, 5, "copying files") == "40 % — copying files"
    assert progress_note(3, None, None) == "step 3"
    assert progress_note(7, 5, "<!channel> done") == "100 % — &lt;!channel&gt; done"
    title = titled("x" * 300, progress_note(1, 2, "y" * 500))
    assert md.slack_len(title) <= MAX_TITLE and title.startswith("x") and "50 %" in title


# --- feedback ---------------------------------------------------------------------------


def test_the_feedback_row() -> None:
    (block,) = feedback_blocks(THREAD, "1700000000.000100")
    parsed = SdkBlock.parse(block)
    assert parsed is not None and parsed.to_dict() == block
    parsed.validate_json()
    assert block["type"] == "context_actions"
    (buttons,) = block["elements"]
    assert buttons["type"] == "feedback_buttons" and buttons["action_id"] == FEEDBACK_ACTION
    assert FEEDBACK_ACTION == "opsloop_feedback"
    assert buttons["positive_button"]["value"] == "up"
    assert buttons["negative_button"]["value"] == "down"
    assert parse_feedback_block(block["block_id"]) == (THREAD, "1700000000.000100")
    assert parse_feedback_block("opsloop_cancel|x|y") is None
    assert parse_feedback_block(None) is None
    (long,) = feedback_blocks("t" * 300, "1.2")
    assert "block_id" not in long  # too long for one: the listener reads the message


def test_plan_text_for_notifications() -> None:
    run = only(Log().ask("deploy api").answer("Deployed " + "x" * 1000))
    text = plan.plan_text(run)
    assert text.startswith("deploy api\nDeployed x") and len(text) < 400
