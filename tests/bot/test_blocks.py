"""Block Kit rendering: structure, escaping of untrusted text, and Slack's limits."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from slack_sdk.models.blocks import Block as SdkBlock
from slack_sdk.models.views import View as SdkView

from bot import blocks as b
from bot import limits
from bot import mrkdwn as md
from engine import events as ev
from engine.state import CallSetback, PendingCall, SaidSince, ThreadState, WaitInfo

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 2, 9, 30, tzinfo=UTC)
LATER = NOW + timedelta(hours=1)
THREAD = "thr_0123456789abcdef0123"
CALL_ID = "toolu_01ABCdef"
HASH = "0f" * 16
REQUESTER = "U0REQUEST1"
REVIEWER = "U0REVIEW01"
EVIL = "<!channel> <@U999> <https://evil.example|bank> & stuff"
WEIRD = "Z̤͔ͧ̑̓ä͖̭̈̇ 👩‍👩‍👧‍👦 🇫🇷🇩🇪 \u202eevil\u202c \x00 ﷽ 𝕏 e\u0301 ```"
DATE_TOKEN = r"<!date\^\d+\^\{date_short_pretty\} at \{time\}\|[0-9: -]+UTC>"
OUR_TOKENS = re.compile(rf"<@(?:{REQUESTER}|{REVIEWER})>|<!subteam\^S0GROUP01>|{DATE_TOKEN}")


# --- builders -------------------------------------------------------------------------


def requested(intent: str = "refund_customer", arguments: dict[str, Any] | None = None, **kw):
    return ev.ToolCallRequested(
        thread_id=THREAD,
        tool_call_id=kw.pop("tool_call_id", CALL_ID),
        intent=intent,
        arguments={"order_id": "A-1", "amount_cents": 500} if arguments is None else arguments,
        policy=kw.pop("policy", "approve_before_run"),
        idempotency_key=f"{THREAD}:{CALL_ID}",
        **kw,
    )


def card_inputs(text: str = "Customer asked for it", **call_kw: Any) -> dict[str, Any]:
    return {
        "thread_id": THREAD,
        "requester": REQUESTER,
        "call": requested(**call_kw),
        "reason": text,
        "expires_at": LATER,
        "arguments_hash": HASH,
    }


def pending(phase: str = "awaiting_approval", intent: str = "refund_customer", **kw: Any):
    return PendingCall(
        tool_call_id=CALL_ID,
        intent=intent,
        arguments={"order_id": "A-1"},
        policy="approve_before_run",
        idempotency_key=f"{THREAD}:{CALL_ID}",
        phase=phase,
        arguments_hash=HASH,
        expires_at=LATER,
        **kw,
    )


def state(status: str, **kw: Any) -> ThreadState:
    return ThreadState(thread_id=THREAD, status=status, requester=REQUESTER, **kw)


def wait_info(text: str = "deploy job 42") -> WaitInfo:
    return WaitInfo(wait_id="w1", description=text, data={}, wake_at=NOW, timeout_at=LATER)


def shown_events(text: str = EVIL, args: Any = None) -> list[ev.Event]:
    """One event of every type the thread shows, with ``text`` wherever text goes."""
    args = {"q": text} if args is None else args
    env = {"thread_id": THREAD}
    return [
        requested(text, args, policy="run_now"),
        ev.ToolResult(**env, tool_call_id=CALL_ID, attempt=1, ok=True, output={"out": text}),
        ev.ToolResult(**env, tool_call_id=CALL_ID, attempt=1, ok=False, error=text),
        ev.RetryScheduled(**env, tool_call_id=CALL_ID, attempt=2, wake_at=LATER, error=text),
        ev.RetryScheduled(**env, attempt=1, wake_at=LATER, error=text),
        ev.WaitStarted(
            **env,
            tool_call_id=CALL_ID,
            wait_id="w1",
            description=text,
            wake_at=NOW,
            timeout_at=LATER,
        ),
        ev.WaitFinished(**env, tool_call_id=CALL_ID, wait_id="w1", result={"r": text}),
        ev.WaitTimedOut(**env, tool_call_id=CALL_ID, wait_id="w1"),
        ev.ClarificationRequested(**env, tool_call_id=CALL_ID, question=text),
        ev.DecisionRejected(**env, tool_call_id=CALL_ID, reason=text),
        ev.ErrorRaised(**env, message=text, kind="tool_failed"),
        ev.FinalAnswer(**env, text=text),
        ev.ThreadCancelled(**env, actor=REQUESTER, reason=text),
    ]


def statuses(text: str = EVIL, intent: str = "refund_customer") -> list[ThreadState]:
    return [
        state("new"),
        state("running"),
        state("awaiting_approval", pending=pending(intent=intent)),
        state(
            "awaiting_approval",
            pending=pending(intent=intent, approvers=("S0GROUP01",), quorum=2, votes=(REVIEWER,)),
        ),
        state("awaiting_reconcile", pending=pending("unknown", intent=intent)),
        state("awaiting_reply"),
        state("awaiting_job", pending=pending("waiting", intent=intent, wait=wait_info(text))),
        state("sleeping", pending=pending("retry_wait", retry_at=LATER)),
        state("sleeping", model_retry_at=LATER),
        state("idle"),
        *(state("idle", setback=CallSetback(kind=k, intent=intent)) for k in SETBACKS),
        state("failed"),
        state("cancelled"),
    ]


SETBACKS = ("rejected", "expired", "failed")


def notes(text: str = EVIL, source_kind: str = "slack", count: int = 1) -> b.Notes:
    said = [
        SaidSince(event_id=f"evt_{i}", actor=REQUESTER, text=text, created_at=NOW, source_kind=k)
        for i, k in enumerate(["", source_kind][-count:])
    ]
    return b.Notes(said, count)


def every_rendering(
    text: str = EVIL, args: Any = None, intent: str = "refund_customer"
) -> Iterator[tuple[str, list[dict[str, Any]] | dict[str, Any]]]:
    """(name, blocks or view) for every renderer, fed ``text`` wherever text goes."""
    inputs = card_inputs(text, intent=intent, arguments={"x": text} if args is None else args)
    yield "approval_card", b.approval_card(**inputs)
    for kind, count in (("slack", 1), ("", 7)):
        noted = inputs | {"notes": notes(text, kind, count), "people": frozenset({REVIEWER})}
        yield f"approval_card[noted {kind} {count}]", b.approval_card(**noted)
        yield (
            f"decided_card[noted {kind} {count}]",
            b.decided_card(**noted, outcome="approved", by=REVIEWER, at=NOW),
        )
    for outcome in ("approved", "rejected", "expired", "cancelled"):
        yield (
            f"decided_card[{outcome}]",
            b.decided_card(**inputs, outcome=outcome, by=REVIEWER, at=NOW, decision_reason=text),
        )
    yield (
        "decided_card[cancelled, nobody]",
        b.decided_card(**inputs, outcome="cancelled", by=None, at=NOW),
    )
    for event in shown_events(text, args):
        for name, req in ((intent, REQUESTER), (None, None)):
            blocks = b.event_line(event, tool_name=name, requester=req)
            assert blocks is not None, event.type
            yield f"event_line[{event.type}]", blocks
    for s in statuses(text, intent):
        yield (
            f"status_message[{s.status}]",
            b.status_message(s, THREAD, approvers=[REVIEWER, "S0GROUP01"]),
        )
    yield (
        "reject_modal",
        b.reject_modal(
            thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, tool_name=intent
        ),
    )
    refused = requested(
        intent, {"x": text} if args is None else args, policy="reject", rule=1, reason=text
    )
    yield "event_line[tool_call_requested, reject]", b.event_line(refused) or []
    ruled = inputs | {"call": ruled_call(text, intent, args)}
    votes = b.Votes((REVIEWER, f"U{text}"), 3)
    yield "approval_card[rule, votes]", b.approval_card(**ruled, votes=votes)
    for outcome in ("approved", "rejected", "expired"):
        yield (
            f"decided_card[rule, votes, {outcome}]",
            b.decided_card(**ruled, outcome=outcome, by=REVIEWER, at=NOW, votes=votes),
        )
    unknown = outcome_unknown(text)
    recon = {"thread_id": THREAD, "requester": REQUESTER, "call": ruled["call"], "unknown": unknown}
    yield "reconcile_card", b.reconcile_card(**recon, arguments_hash=HASH)
    for decided in ("happened", "retry", "abandon", "cancelled"):
        yield (
            f"reconciled_card[{decided}]",
            b.reconciled_card(**recon, outcome=decided, by=REVIEWER, at=NOW, note=text),
        )
    yield (
        "note_modal",
        b.note_modal(thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, tool_name=intent),
    )


def ruled_call(text: str = EVIL, intent: str = "deploy", args: Any = None) -> ev.ToolCallRequested:
    """A call decided by rule 3 of a policy file: 2 of a user, a group and the on-call."""
    return requested(
        intent,
        {"x": text} if args is None else args,
        rule=2,
        approvers=(REVIEWER, "S0GROUP01", f"oncall:{text}"),
        quorum=2,
        policy_hash="ab" * 32,
    )


def outcome_unknown(error: str = "connection lost") -> ev.ToolOutcomeUnknown:
    return ev.ToolOutcomeUnknown(
        thread_id=THREAD, tool_call_id=CALL_ID, attempt=1, started_at=NOW, error=error
    )


def text_objects(node: Any) -> Iterator[str]:
    """Every text of every text object in ``node`` (what Slack renders)."""
    if isinstance(node, dict):
        if node.get("type") in ("plain_text", "mrkdwn") and isinstance(node.get("text"), str):
            yield node["text"]
        for value in node.values():
            yield from text_objects(value)
    elif isinstance(node, list):
        for item in node:
            yield from text_objects(item)


def assert_safe(text: str) -> None:
    """Only our own ``<…>`` tokens, and every ``&`` starts an entity."""
    rest = OUR_TOKENS.sub("", text)
    assert "<" not in rest and ">" not in rest, text
    assert not re.search(r"&(?!amp;|lt;|gt;)", text), text


def sdk_validate(rendering: list[dict[str, Any]] | dict[str, Any]) -> None:
    """slack_sdk's own models as a second opinion on the limits."""
    if isinstance(rendering, dict):
        SdkView(**rendering).validate_json()
        return
    for block in rendering:
        SdkBlock.parse(block).validate_json()


def find(blocks: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [blk for blk in blocks if blk["type"] == kind]


# --- mrkdwn -----------------------------------------------------------------------------


def test_escape_neutralises_mentions_links_and_entities() -> None:
    assert md.escape(EVIL) == (
        "&lt;!channel&gt; &lt;@U999&gt; &lt;https://evil.example|bank&gt; &amp; stuff"
    )
    assert md.escape("&amp;") == "&amp;amp;"  # shown as the model wrote it


def test_escape_drops_control_and_bidi_characters() -> None:
    assert md.escape("pay \u202e0005\u202c now\x00\x1b[31m\n") == "pay 0005 now[31m\n"


def test_arguments_show_bidi_tricks_instead_of_obeying_them() -> None:
    blocks = b.approval_card(**card_inputs(arguments={"amount": "\u202e0005"}))
    assert '"amount": "\\u202e0005"' in blocks[2]["text"]["text"]


def test_mention_only_for_slack_user_ids() -> None:
    assert md.mention("U0123ABC") == "<@U0123ABC>"
    assert md.mention("W0123ABC") == "<@W0123ABC>"
    assert md.mention("<!here>") == "&lt;!here&gt;"
    assert md.mention("u0123abc") == "u0123abc"
    assert md.mention("U12>|x") == "U12&gt;|x"
    assert md.mention(None) == "someone"
    assert md.group_mention("S0GROUP01") == "<!subteam^S0GROUP01>"
    assert md.group_mention("S0<x") == "S0&lt;x"


def test_date_token_has_a_utc_fallback() -> None:
    assert md.date(NOW) == (
        f"<!date^{int(NOW.timestamp())}^{{date_short_pretty}} at {{time}}|2026-01-02 09:30 UTC>"
    )


def test_truncate_appends_the_pointer_within_the_limit() -> None:
    pointer = md.trace_pointer(THREAD)
    out = md.truncate("x" * 5000, 3000, pointer)
    assert len(out) == 3000 and out.endswith(pointer)
    assert pointer == f"… (truncated; full text: `opsloop trace {THREAD}`)"
    assert md.truncate("short", 3000, pointer) == "short"


def test_truncate_never_cuts_an_entity_a_token_or_a_grapheme() -> None:
    assert md.truncate("ab&amp;cd", 6) == "ab…"
    assert md.truncate("hi <@U0REQUEST1> there", 10) == "hi…"
    assert md.truncate("👍🏽👍🏽👍🏽", 5) == "👍🏽…"
    assert md.truncate("e\u0301e\u0301e\u0301", 4) == "e\u0301…"
    assert md.truncate("🇫🇷🇩🇪🇮🇹", 7) == "🇫🇷…"
    assert md.truncate("👩‍👩‍👧‍👦👩‍👩‍👧‍👦", 12) == "👩‍👩‍👧‍👦…"


def test_lengths_count_utf16_units_like_the_strictest_reading_of_slack() -> None:
    assert md.slack_len("𝕏") == 2
    assert md.slack_len(md.truncate("𝕏" * 100, 11)) <= 11


def test_code_block_cannot_be_closed_by_the_text() -> None:
    out = md.code_block("a ``` b ```` c `x`", 200)
    assert out.startswith("```\n") and out.endswith("\n```")
    assert out.count("```") == 2


def test_code_block_is_cut_inside_the_fence_with_the_pointer_after_it() -> None:
    pointer = md.trace_pointer(THREAD)
    out = md.code_block("<" * 10_000, 500, pointer)
    assert md.slack_len(out) <= 500
    assert out.endswith("\n```\n" + pointer)
    assert out.count("```") == 2
    assert "&lt;…\n```" in out  # whole entities up to the ellipsis


@given(st.text(max_size=400), st.integers(min_value=0, max_value=300))
def test_truncate_respects_any_limit(text: str, limit: int) -> None:
    out = md.truncate(md.escape(text), limit, "…")
    assert md.slack_len(out) <= limit
    assert not re.search(r"&(?!amp;|lt;|gt;)", out)
    if md.slack_len(md.escape(text)) <= limit:
        assert out == md.escape(text)


@given(st.text(max_size=400), st.integers(min_value=40, max_value=300))
def test_code_block_is_always_one_closed_fence(text: str, limit: int) -> None:
    out = md.code_block(text, limit, md.trace_pointer(THREAD))
    assert md.slack_len(out) <= limit
    assert out.count("```") in (0, 2)  # 0 only when not even a fence fits
    assert "<" not in out.replace(md.trace_pointer(THREAD), "")


@given(st.text(alphabet=st.sampled_from("ab <>&\n`"), max_size=3000))
def test_split_text_chunks_fit_and_keep_fences_balanced(text: str) -> None:
    for chunk in md.split_text(md.escape(text), 200):
        assert md.slack_len(chunk) <= 200


def test_split_text_keeps_every_character_and_reopens_cut_fences() -> None:
    prose = " ".join(f"word{i}" for i in range(2000))
    assert "".join(md.split_text(prose, 3000)) == prose
    code = "intro\n```\n" + "line\n" * 2000 + "```\nafter"
    chunks = md.split_text(code, 3000)
    assert len(chunks) > 2
    assert all(c.count("```") % 2 == 0 for c in chunks)
    assert all(c.startswith("```\n") for c in chunks[1:-1])


# --- the approval card ------------------------------------------------------------------


def test_approval_card_structure() -> None:
    blocks = b.approval_card(**card_inputs())
    assert [blk["type"] for blk in blocks] == [
        "header",
        "section",
        "section",
        "section",
        "context",
        "actions",
    ]
    header, who, arguments, why, expiry, actions = blocks
    assert header["text"] == {
        "type": "plain_text",
        "text": "Approval needed: refund_customer",
        "emoji": True,
    }
    assert who["fields"][0]["text"] == f"*Requested by*\n<@{REQUESTER}>"
    assert who["fields"][1]["text"] == "*Tool*\n*refund_customer*"
    assert arguments["text"]["text"] == (
        '*Arguments*\n```\n{\n  "amount_cents": 500,\n  "order_id": "A-1"\n}\n```'
    )
    assert why["text"]["text"] == "*Why*\nCustomer asked for it"
    assert md.date(LATER) in expiry["elements"][0]["text"]
    assert f"`{CALL_ID}`" in expiry["elements"][0]["text"]
    assert actions["block_id"] == f"opsloop_approval:{CALL_ID}"
    approve, reject = actions["elements"]
    assert (approve["action_id"], approve["style"], approve["text"]["text"]) == (
        "opsloop_approve",
        "primary",
        "Approve",
    )
    assert (reject["action_id"], reject["style"], reject["text"]["text"]) == (
        "opsloop_reject",
        "danger",
        "Reject",
    )
    assert approve["confirm"]["confirm"]["text"] == "Approve"
    assert approve["confirm"]["title"]["text"] == "Run refund_customer?"
    assert "confirm" not in reject  # reject opens the reason modal instead
    for button in (approve, reject):
        assert json.loads(button["value"]) == {"t": THREAD, "c": CALL_ID, "h": HASH}
        assert b.parse_binding(button["value"]) == b.Binding(THREAD, CALL_ID, HASH)
        assert " " not in button["value"]  # compact
    assert limits.check_limits(blocks) == []


def test_approval_card_from_a_pending_call_uses_its_hash() -> None:
    blocks = b.approval_card(
        thread_id=THREAD, requester=REQUESTER, call=pending(), reason="", expires_at=LATER
    )
    assert b.parse_binding(blocks[-1]["elements"][0]["value"]).arguments_hash == HASH
    assert "_The model gave no reason._" in blocks[3]["text"]["text"]


def test_approval_card_without_a_hash_is_refused() -> None:
    with pytest.raises(ValueError, match="arguments hash"):
        b.approval_card(
            thread_id=THREAD, requester=REQUESTER, call=requested(), reason="", expires_at=LATER
        )


def test_approval_card_shows_long_arguments_cut_with_a_pointer_to_the_trace() -> None:
    blocks = b.approval_card(**card_inputs(arguments={"blob": "x" * 100_000}))
    text = blocks[2]["text"]["text"]
    assert len(text) <= limits.MAX_TEXT
    assert text.endswith(f"```\n… (truncated; full text: `opsloop trace {THREAD}`)")


@pytest.mark.parametrize(
    ("binding", "why"),
    [
        ("", "not JSON"),
        ("nope", "not JSON"),
        ("[1]", "wrong keys"),
        ('{"t":"a","c":"b"}', "wrong keys"),
        ('{"t":"a","c":"b","h":"c","x":1}', "wrong keys"),
        ('{"t":"a","c":"","h":"c"}', "empty"),
        ('{"t":"a","c":1,"h":"c"}', "non-string"),
    ],
)
def test_parse_binding_refuses_forged_values(binding: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        b.parse_binding(binding)


def test_binding_value_refuses_ids_too_long_for_a_button() -> None:
    with pytest.raises(ValueError, match="too long"):
        b.binding_value(THREAD, "x" * 2000, HASH)


@pytest.mark.parametrize(
    ("outcome", "by", "title", "line"),
    [
        # Slack renders the date as "today at 6:25 PM": no "at" before it (issue 8).
        ("approved", REVIEWER, "Approved: refund_customer", f"✅ Approved by <@{REVIEWER}> <!date"),
        ("rejected", REVIEWER, "Rejected: refund_customer", f"❌ Rejected by <@{REVIEWER}> <!date"),
        ("expired", None, "Approval expired: refund_customer", "⌛ Expired <!date"),
        ("cancelled", REQUESTER, "Cancelled: refund_customer", f"🚫 Cancelled by <@{REQUESTER}>"),
        ("cancelled", None, "Cancelled: refund_customer", "🚫 Cancelled <!date"),
    ],
)
def test_decided_card_has_no_buttons_and_names_who_and_when(
    outcome: str, by: str | None, title: str, line: str
) -> None:
    blocks = b.decided_card(**card_inputs(), outcome=outcome, by=by, at=NOW)
    assert not find(blocks, "actions")
    assert "opsloop_approve" not in json.dumps(blocks)
    assert blocks[0]["text"]["text"] == title
    outcome_text = blocks[-1]["text"]["text"]
    assert outcome_text.startswith(line)
    assert md.date(NOW) in outcome_text
    assert blocks[1:4] == b.approval_card(**card_inputs())[1:4]  # same audit record
    assert limits.check_limits(blocks) == []


def test_decided_card_carries_the_reject_reason_escaped() -> None:
    blocks = b.decided_card(
        **card_inputs(), outcome="rejected", by=REVIEWER, at=NOW, decision_reason="no <@U1>"
    )
    assert blocks[-1]["text"]["text"].endswith(" — no &lt;@U1&gt;")


# --- event lines ------------------------------------------------------------------------


def line_text(blocks: list[dict[str, Any]] | None) -> str:
    assert blocks is not None
    return "\n".join(text_objects(blocks))


def test_tool_call_line_shows_the_tool_and_its_arguments_on_one_line() -> None:
    blocks = b.event_line(requested("search_docs", {"query": "a\nb"}, policy="run_now"))
    assert blocks == [
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": '🔧 *search_docs* `{"query":"a\\nb"}`'}],
        }
    ]


def test_tool_call_line_truncates_arguments() -> None:
    text = line_text(b.event_line(requested("t", {"q": "x" * 10_000}, policy="run_now")))
    assert len(text) < 400 and text.endswith("…`")


def test_a_call_that_needs_approval_is_shown_by_its_card() -> None:
    assert b.event_line(requested()) is None


def test_event_lines_say_what_happened() -> None:
    lines = {}
    for event in shown_events("boom"):
        key = event.type + ("" if getattr(event, "ok", True) else ":error")
        key += ":model" if event.type == "retry_scheduled" and not event.tool_call_id else ""
        lines[key] = line_text(b.event_line(event, tool_name="deploy", requester=REQUESTER))
    assert lines["tool_call_requested"] == '🔧 *boom* `{"q":"boom"}`'
    assert lines["tool_result"] == '✔️ *deploy* done: `{"out":"boom"}`'
    assert lines["tool_result:error"] == "⚠️ *deploy* failed: boom"
    assert lines["retry_scheduled"].startswith("🔁 Attempt 2 of *deploy* failed: boom; retrying")
    assert md.date(LATER) in lines["retry_scheduled"]
    assert lines["wait_started"] == f"⏳ Waiting for boom (gives up {md.date(LATER)})"
    assert lines["wait_finished"] == '✔️ The wait is over: `{"r":"boom"}`'
    assert lines["wait_timed_out"] == "⌛ Gave up waiting (`w1`): it timed out"
    assert lines["clarification_requested"] == (
        f"❓ <@{REQUESTER}> boom\nReply in this thread to answer."
    )
    assert lines["decision_rejected"] == "↩️ The model's proposal was refused: boom"
    assert lines["error"].startswith("⚠️ *tool_failed*: boom\nThis thread needs a human.")
    assert lines["final_answer"] == "boom"
    assert lines["thread_cancelled"] == f"🚫 Cancelled by <@{REQUESTER}>: boom"


def test_model_retry_and_unnamed_calls() -> None:
    retry = ev.RetryScheduled(thread_id=THREAD, attempt=1, wake_at=LATER, error="529")
    assert "Attempt 1 of the model call failed: 529" in line_text(b.event_line(retry))
    result = ev.ToolResult(thread_id=THREAD, tool_call_id=CALL_ID, attempt=1, ok=True)
    assert line_text(b.event_line(result)) == f"✔️ `{CALL_ID}` done"


def test_the_question_is_a_prominent_section() -> None:
    question = ev.ClarificationRequested(thread_id=THREAD, tool_call_id=CALL_ID, question="Which?")
    blocks = b.event_line(question)
    assert blocks is not None and blocks[0]["type"] == "section"
    assert blocks[0]["text"]["text"] == "❓ Which?"


@pytest.mark.parametrize(
    "event",
    [
        ev.UserMessage(thread_id=THREAD, text="hi", actor=REQUESTER),
        ev.ModelDecision(thread_id=THREAD, text="thinking", tool_name="t", tool_call_id="c"),
        ev.ToolStarted(thread_id=THREAD, tool_call_id=CALL_ID, attempt=1),
        ev.ApprovalRequested(
            thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, expires_at=LATER
        ),
        ev.ApprovalGranted(thread_id=THREAD, tool_call_id=CALL_ID, actor=REVIEWER),
        ev.ApprovalRejected(thread_id=THREAD, tool_call_id=CALL_ID, actor=REVIEWER),
        ev.ApprovalExpired(thread_id=THREAD, tool_call_id=CALL_ID),
        ev.ApprovalRefused(
            thread_id=THREAD, tool_call_id=CALL_ID, decision="approve", reason="not an approver"
        ),
        ev.ClarificationAnswered(thread_id=THREAD, tool_call_id=CALL_ID, text="this one"),
        ev.MessagePosted(thread_id=THREAD, shows_event_id="evt_1", channel="C1", ts="1.2"),
    ],
    ids=lambda e: e.type,
)
def test_events_not_shown_as_lines(event: ev.Event) -> None:
    assert b.event_line(event) is None
    assert event.type not in b.SHOWN_TYPES


def test_shown_and_card_types_cover_every_event_type_at_most_once() -> None:
    assert not b.SHOWN_TYPES & b.CARD_TYPES
    assert b.SHOWN_TYPES | b.CARD_TYPES <= set(ev.EVENT_TYPES)


def test_every_type_people_see_as_a_line_has_a_renderer_and_no_other_does() -> None:
    lines = [c for c in ev.EVENT_CLASSES if c.facts.people == "line"]
    assert ev.missing_from(b.LINES, lines) == []
    assert {ev.type_name(c) for c in b.LINES} == b.SHOWN_TYPES


def test_shown_and_card_types_are_as_before_the_facts_replaced_the_tables() -> None:
    assert b.SHOWN_TYPES == {
        "tool_call_requested",
        "tool_result",
        "retry_scheduled",
        "wait_started",
        "wait_finished",
        "wait_timed_out",
        "clarification_requested",
        "decision_rejected",
        "error",
        "final_answer",
        "thread_cancelled",
    }
    assert b.CARD_TYPES == {
        "approval_requested",
        "approval_granted",
        "approval_rejected",
        "approval_expired",
        "tool_outcome_unknown",
        "reconcile_decided",
    }


def test_a_long_final_answer_is_split_into_sections() -> None:
    text = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum " * 40 for i in range(40))
    blocks = b.event_line(ev.FinalAnswer(thread_id=THREAD, text=text))
    assert blocks is not None and len(text) > 3000 * 5
    assert all(blk["type"] == "section" for blk in blocks)
    assert all(len(blk["text"]["text"]) <= 3000 for blk in blocks)
    assert "".join(blk["text"]["text"] for blk in blocks) == text.strip()
    assert limits.check_limits(blocks) == []


def test_an_enormous_final_answer_stops_at_50_blocks_with_a_pointer() -> None:
    blocks = b.event_line(ev.FinalAnswer(thread_id=THREAD, text="word " * 60_000))
    assert blocks is not None and len(blocks) == 50
    assert blocks[-1]["text"]["text"].endswith(md.trace_pointer(THREAD))
    assert limits.check_limits(blocks) == []


# --- the status line --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("s", "text", "cancel"),
    [
        (state("new"), "⚙️ Working…", False),  # the engine cannot cancel a new thread
        (state("running"), "⚙️ Working…", True),
        (
            state("awaiting_approval", pending=pending()),
            f"⏸️ Waiting for approval from <@{REVIEWER}>, <!subteam^S0GROUP01> "
            f"to run *refund_customer* (expires {md.date(LATER)})",
            True,
        ),
        (
            state("awaiting_reply"),
            f"💬 Waiting for your reply, <@{REQUESTER}>: answer in this thread",
            True,
        ),
        (
            state("awaiting_job", pending=pending("waiting", wait=wait_info())),
            f"⏳ Waiting for job: deploy job 42 (gives up {md.date(LATER)})",
            True,
        ),
        (state("sleeping", model_retry_at=LATER), f"🔁 Retrying {md.date(LATER)}", True),
        (state("idle"), "✅ Done", False),
        (state("failed"), "⚠️ Failed: needs a human", False),
        (state("cancelled"), "🚫 Cancelled", False),
    ],
    ids=lambda v: v.status if isinstance(v, ThreadState) else None,
)
def test_status_message(s: ThreadState, text: str, cancel: bool) -> None:
    blocks = b.status_message(s, THREAD, approvers=[REVIEWER, "S0GROUP01"])
    assert blocks[0]["text"]["text"] == text
    assert ("accessory" in blocks[0]) is cancel
    if cancel:
        button = blocks[0]["accessory"]
        assert (button["action_id"], button["value"], button["style"]) == (
            "opsloop_cancel",
            THREAD,
            "danger",
        )
        assert button["confirm"]["confirm"]["text"] == "Cancel thread"
    assert f"`opsloop trace {THREAD}`" in blocks[1]["elements"][0]["text"]
    assert limits.check_limits(blocks) == []


def test_status_without_approvers_asks_for_a_reviewer() -> None:
    blocks = b.status_message(state("awaiting_approval", pending=pending()), THREAD)
    assert blocks[0]["text"]["text"].startswith("⏸️ Waiting for approval from a reviewer")


# --- the reject modal -------------------------------------------------------------------


def test_reject_modal() -> None:
    view = b.reject_modal(
        thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, tool_name="refund_customer"
    )
    assert view["type"] == "modal"
    assert view["callback_id"] == "opsloop_reject_reason"
    assert b.parse_binding(view["private_metadata"]) == b.Binding(THREAD, CALL_ID, HASH)
    assert view["title"]["text"] == "Reject tool call" and len(view["title"]["text"]) <= 24
    assert view["submit"]["text"] == "Reject" and view["close"]["text"] == "Cancel"
    [intro, reason] = view["blocks"]
    assert "*refund_customer*" in intro["text"]["text"]
    assert reason["type"] == "input" and reason["block_id"] == "reason"
    assert reason["optional"] is True
    assert reason["element"] | {"placeholder": None} == {
        "type": "plain_text_input",
        "action_id": "reason",
        "multiline": True,
        "max_length": 2000,
        "placeholder": None,
    }
    assert limits.check_limits(view) == []


# --- the notification text --------------------------------------------------------------


def test_fallback_text_of_blocks_and_events() -> None:
    card = b.approval_card(**card_inputs())
    assert b.fallback_text(card).startswith("Approval needed: refund_customer · ")
    answer = ev.FinalAnswer(thread_id=THREAD, text="x" * 20_000)
    assert len(b.fallback_text(answer)) <= 3000
    started = ev.ToolStarted(thread_id=THREAD, tool_call_id=CALL_ID, attempt=1)
    assert b.fallback_text(started) == f"{CALL_ID} attempt 1"
    assert b.fallback_text([]) == "opsloop"


def test_fallback_text_is_escaped() -> None:
    for event in shown_events():
        assert_safe(b.fallback_text(event))
    refused = ev.ApprovalRefused(
        thread_id=THREAD, tool_call_id=CALL_ID, decision="approve", reason=EVIL
    )
    assert_safe(b.fallback_text(refused))


# --- escaping everywhere ----------------------------------------------------------------


EVIL_RENDERINGS = list(every_rendering(EVIL, intent=EVIL))


@pytest.mark.parametrize(
    "rendering",
    [r for _, r in EVIL_RENDERINGS],
    ids=[f"{i}-{name}" for i, (name, _) in enumerate(EVIL_RENDERINGS)],
)
def test_untrusted_text_never_pings_or_links(rendering: Any) -> None:
    dumped = json.dumps(rendering, ensure_ascii=False)
    for raw in ("<!channel>", "<@U999>", "<https://evil.example", "& stuff"):
        assert raw not in dumped
    for text in text_objects(rendering):
        assert_safe(text)
    if not isinstance(rendering, dict):
        assert_safe(b.fallback_text(rendering))


def test_the_untrusted_text_is_shown_escaped() -> None:
    carrying = [
        name
        for name, rendering in EVIL_RENDERINGS
        if any("&lt;!channel&gt; &lt;@U999&gt;" in t for t in text_objects(rendering))
    ]
    assert len(carrying) >= 30, carrying


def test_our_own_mentions_do_appear() -> None:
    dumped = json.dumps(b.approval_card(**card_inputs(EVIL)))
    assert f"<@{REQUESTER}>" in dumped


def test_a_requester_that_is_not_a_user_id_is_escaped() -> None:
    inputs = card_inputs() | {"requester": "<!everyone>"}
    fields = b.approval_card(**inputs)[1]["fields"]
    assert fields[0]["text"] == "*Requested by*\n&lt;!everyone&gt;"


# --- Slack's limits ---------------------------------------------------------------------

HUGE_ARGS = {
    "blob": "<&>" * 34_000,
    "rows": [{"id": i, "note": "ü" * 50} for i in range(300)],
    "nested": {"a": {"b": {"c": ["```"] * 100}}},
}
OVERSIZED = [
    ("100 KB arguments", "short", HUGE_ARGS, "refund_customer"),
    ("20,000-character texts", "y" * 20_000, None, "refund_customer"),
    ("300-character tool name", "short", None, "t" * 300),
    ("weird unicode", WEIRD * 400, {WEIRD: WEIRD * 200}, WEIRD * 20),
    ("escaping blow-up", "<" * 20_000, {"x": "&" * 30_000}, "<" * 300),
    ("empty texts", "", {}, "x"),
]


@pytest.mark.parametrize(
    ("text", "args", "intent"), [o[1:] for o in OVERSIZED], ids=[o[0] for o in OVERSIZED]
)
def test_every_renderer_keeps_slacks_limits(text: str, args: Any, intent: str) -> None:
    renderings = list(every_rendering(text, args, intent))
    assert len(renderings) > 30
    for name, rendering in renderings:
        assert limits.check_limits(rendering) == [], name
        sdk_validate(rendering)
        if not isinstance(rendering, dict):
            assert len(b.fallback_text(rendering)) <= 3000


def test_a_20000_character_answer_fits() -> None:
    blocks = b.event_line(ev.FinalAnswer(thread_id=THREAD, text="z" * 20_000))
    assert blocks is not None and 7 <= len(blocks) <= 50
    assert limits.check_limits(blocks) == []


def button(**kw: Any) -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": kw.pop("text", "ok")},
        "action_id": kw.pop("action_id", "a"),
        **kw,
    }


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


@pytest.mark.parametrize(
    ("rendering", "problem"),
    [
        ([section("x")] * 51, "message: 51 blocks > 50"),
        ([section("x" * 3001)], "blocks[0].text.text: 3001 characters > 3000"),
        ([section("")], "blocks[0].text.text: empty"),
        (
            [{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}],
            "blocks[0].text.text: 151 characters > 150",
        ),
        (
            [{"type": "header", "text": {"type": "mrkdwn", "text": "h"}}],
            "blocks[0].text: must be plain_text",
        ),
        (
            [{"type": "context", "elements": [{"type": "mrkdwn", "text": "c"}] * 11}],
            "blocks[0].elements: 11, 1 to 10",
        ),
        (
            [{"type": "actions", "elements": [button(action_id=f"a{i}") for i in range(26)]}],
            "blocks[0].elements: 26, 1 to 25",
        ),
        (
            [{"type": "actions", "elements": [button(), button()]}],
            "blocks[0].elements: duplicate action_id",
        ),
        (
            [{"type": "actions", "elements": [button(text="b" * 76)]}],
            "blocks[0].elements[0].text.text: 76 characters > 75",
        ),
        (
            [{"type": "actions", "elements": [button(value="v" * 2001)]}],
            "blocks[0].elements[0].value: 2001 characters > 2000",
        ),
        (
            [{"type": "actions", "elements": [button(action_id="a" * 256)]}],
            "blocks[0].elements[0].action_id: 256 characters > 255",
        ),
        (
            [{"type": "actions", "elements": [button(style="green")]}],
            "blocks[0].elements[0].style: 'green'",
        ),
        ([section("x") | {"block_id": "b" * 256}], "blocks[0].block_id: 256 characters > 255"),
        (
            [section("x") | {"block_id": "b"}, section("y") | {"block_id": "b"}],
            "blocks[1].block_id: duplicate 'b'",
        ),
        (
            {
                "type": "modal",
                "title": {"type": "plain_text", "text": "t" * 25},
                "blocks": [section("x")],
            },
            "view.title.text: 25 characters > 24",
        ),
        (
            {
                "type": "modal",
                "title": {"type": "plain_text", "text": "t"},
                "blocks": [section("x")] * 101,
            },
            "view: 101 blocks, 1 to 100",
        ),
        (
            {
                "type": "modal",
                "title": {"type": "plain_text", "text": "t"},
                "blocks": [
                    {
                        "type": "input",
                        "label": {"type": "plain_text", "text": "l"},
                        "element": {
                            "type": "plain_text_input",
                            "action_id": "r",
                            "max_length": 3001,
                        },
                    }
                ],
            },
            "blocks[0].element.max_length: 3001, 1 to 3000",
        ),
        ([{"type": "video"}], "blocks[0]: block type 'video' is not checked here"),
    ],
)
def test_check_limits_names_each_violation(rendering: Any, problem: str) -> None:
    assert problem in limits.check_limits(rendering)


def test_the_limits_live_in_bot_limits_and_the_moved_names_are_gone_from_bot_blocks() -> None:
    names = [n for n in dir(limits) if n.startswith("MAX_")]
    assert len(names) == 19
    moved = {
        "MAX_ACTIONS_ELEMENTS",
        "MAX_FIELDS",
        "MAX_INPUT_LENGTH",
        "MAX_PRIVATE_METADATA",
        "MAX_URL",
        "MAX_VIEW_BLOCKS",
    }
    assert moved <= set(names)
    assert not [n for n in moved if hasattr(b, n)]


def test_check_limits_counts_astral_characters_twice() -> None:
    assert limits.check_limits([section("𝕏" * 1500)]) == []
    assert limits.check_limits([section("𝕏" * 1501)]) == [
        "blocks[0].text.text: 3002 characters > 3000"
    ]


# --- purity -----------------------------------------------------------------------------


def test_rendering_modules_do_no_io_and_import_no_slack_library() -> None:
    code = (
        "import json, sys\nimport bot.blocks, bot.limits, bot.mrkdwn\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(out.stdout))
    roots = {name.partition(".")[0] for name in loaded}
    forbidden = {
        "slack_sdk",
        "slack_bolt",
        "aiohttp",
        "sqlalchemy",
        "sqlmodel",
        "asyncpg",
        "aiosqlite",
        "anthropic",
        "apscheduler",
    }
    assert not roots & forbidden, sorted(roots & forbidden)
    assert not loaded & {"engine.store", "engine.runner", "bot.cli"}


# --- rules, quorum and the reconcile card (issue 9) ---------------------------------------


def all_text(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(text_objects(blocks))


def test_the_card_names_the_rule_that_decided_and_who_may_approve() -> None:
    call = requested("deploy", rule=2, approvers=(REVIEWER, "S0GROUP01"), quorum=2)
    assert b.rule_text(call) == f"📜 rule 3: needs 2 of <@{REVIEWER}> and <!subteam^S0GROUP01>"
    anyone = requested("deploy", rule=0, approvers=(), quorum=1)
    assert b.rule_text(anyone) == "📜 rule 1: needs 1 approval, from anyone but the requester"
    oncall = requested("deploy", rule=4, approvers=("oncall:PXYZ123",), allow_self=True)
    text = b.rule_text(oncall) or ""
    assert text.startswith("📜 rule 5: needs 1 of whoever is on call (PXYZ123)")
    assert "(the requester may approve too)" in text
    assert "not connected yet" in text  # an on-call entry matches nobody for now
    # A call from before policy files shows no rule line.
    assert b.rule_text(requested()) is None
    assert "📜" not in all_text(b.approval_card(**card_inputs()))


def test_an_open_quorum_card_shows_its_progress_and_the_policy_hash() -> None:
    inputs = card_inputs() | {"call": ruled_call("x", "deploy", {"env": "production"})}
    fresh = b.approval_card(**inputs)
    assert "🗳️ 0 of 2 approvals so far" in all_text(fresh)
    voted = b.approval_card(**inputs, votes=b.Votes((REVIEWER,), 2))
    text = all_text(voted)
    assert f"🗳️ 1 of 2: <@{REVIEWER}>" in text
    assert "rule 3: needs 2 of" in text
    assert f"policy `{'ab' * 6}`" in text
    assert voted[-1]["type"] == "actions"  # still open: the buttons stay
    confirm = voted[-1]["elements"][0]["confirm"]["text"]["text"]
    assert confirm.startswith("opsloop runs")  # this vote is the last one needed
    assert "one of the 2" in fresh[-1]["elements"][0]["confirm"]["text"]["text"]
    assert limits.check_limits(voted) == []


def test_the_approved_quorum_card_names_every_approver() -> None:
    inputs = card_inputs() | {"call": ruled_call("x")}
    carol = "U0CAROL001"
    blocks = b.decided_card(
        **inputs, outcome="approved", by=carol, at=NOW, votes=b.Votes((REVIEWER, carol), 2)
    )
    assert blocks[-1]["text"]["text"].startswith(
        f"✅ Approved by <@{REVIEWER}> and <@{carol}> <!date^"
    )
    assert all(blk["type"] != "actions" for blk in blocks)
    rejected = b.decided_card(
        **inputs, outcome="rejected", by=carol, at=NOW, votes=b.Votes((REVIEWER,), 2)
    )
    assert f"(after approvals by <@{REVIEWER}>)" in rejected[-1]["text"]["text"]


def test_the_reconcile_card_says_what_was_running_since_when_and_offers_three_buttons() -> None:
    call = requested("restart", {"service": "api"})
    blocks = b.reconcile_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=call,
        unknown=outcome_unknown("connection lost after the request went out"),
        arguments_hash=HASH,
    )
    text = all_text(blocks)
    assert blocks[0]["text"]["text"] == "Did it happen? restart"
    assert f"*restart* was running since {md.date(NOW)} when it was interrupted" in text
    assert '"service": "api"' in text
    assert "*What was observed*\nconnection lost after the request went out" in text
    assert "Attempt 1" in text
    actions = blocks[-1]
    assert actions["block_id"] == f"opsloop_reconcile:{CALL_ID}"
    happened, retry, abandon = actions["elements"]
    assert [e["action_id"] for e in actions["elements"]] == [
        b.HAPPENED_ACTION,
        b.RETRY_ACTION,
        b.ABANDON_ACTION,
    ]
    assert [e["text"]["text"] for e in actions["elements"]] == [
        "It happened",
        "Run it again",
        "It did not happen",
    ]
    assert "confirm" not in happened  # it opens the note modal
    assert "may take effect twice" in retry["confirm"]["text"]["text"]
    assert abandon["style"] == "danger"
    for button in actions["elements"]:
        assert b.parse_binding(button["value"]) == b.Binding(THREAD, CALL_ID, HASH)
    assert limits.check_limits(blocks) == []


def test_a_reconcile_card_without_an_error_or_start_time_says_less() -> None:
    unknown = ev.ToolOutcomeUnknown(thread_id=THREAD, tool_call_id=CALL_ID, attempt=2)
    blocks = b.reconcile_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=requested(),
        unknown=unknown,
        arguments_hash=HASH,
    )
    text = all_text(blocks)
    assert "What was observed" not in text and " since " not in text
    assert "Attempt 2" in text


@pytest.mark.parametrize(
    ("outcome", "title", "line"),
    [
        ("happened", "It happened", f"✅ <@{REVIEWER}> said it happened"),
        ("retry", "Run again", f"🔁 <@{REVIEWER}> asked to run it again"),
        ("abandon", "It did not happen", f"🚫 <@{REVIEWER}> said it did not happen"),
        ("cancelled", "Cancelled", f"🚫 Cancelled by <@{REVIEWER}>"),
    ],
)
def test_the_decided_reconcile_card_names_who_decided_what(
    outcome: str, title: str, line: str
) -> None:
    blocks = b.reconciled_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=requested(),
        unknown=outcome_unknown(),
        outcome=outcome,  # type: ignore[arg-type]
        by=REVIEWER,
        at=NOW,
        note="restarted at 10:02 <!here>" if outcome == "happened" else "",
    )
    assert blocks[0]["text"]["text"] == f"{title}: refund_customer"
    last = blocks[-1]["text"]["text"]
    assert last.startswith(f"{line} {md.date(NOW)}")
    if outcome == "happened":
        assert last.endswith("— “restarted at 10:02 &lt;!here&gt;”")
    assert all(blk["type"] != "actions" for blk in blocks)


def test_the_note_modal() -> None:
    view = b.note_modal(
        thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, tool_name="restart"
    )
    assert view["callback_id"] == b.NOTE_CALLBACK
    assert b.parse_binding(view["private_metadata"]) == b.Binding(THREAD, CALL_ID, HASH)
    [intro, note] = view["blocks"]
    assert "The model reads your note" in intro["text"]["text"]
    assert (note["block_id"], note["element"]["action_id"]) == (b.NOTE_BLOCK, b.NOTE_ACTION)
    assert note["optional"] is True
    assert limits.check_limits(view) == []


def test_the_status_line_while_an_outcome_is_unknown_or_a_quorum_is_open() -> None:
    unknown = state("awaiting_reconcile", pending=pending("unknown", intent="restart"))
    text = b.status_text(unknown, [REVIEWER])
    assert text.startswith("❓ *restart* was interrupted: waiting for")
    assert f"<@{REVIEWER}>" in text
    quorum = state(
        "awaiting_approval",
        pending=pending(approvers=("S0GROUP01",), quorum=2, votes=(REVIEWER,)),
    )
    text = b.status_text(quorum, [REVIEWER])  # the call's own approvers win
    assert "<!subteam^S0GROUP01>" in text and f"<@{REVIEWER}>" not in text
    assert text.endswith(", 1 of 2 so far")
    blocks = b.status_message(unknown, THREAD)
    assert blocks[0]["accessory"]["action_id"] == b.CANCEL_ACTION  # cancellable


def test_a_call_a_rule_refused_is_one_line_with_the_reason() -> None:
    refused = requested("purge", policy="reject", rule=1, reason="Nothing is purged from chat.")
    [line] = b.event_line(refused) or []
    assert line["elements"][0]["text"] == (
        "🛑 *purge* was refused by rule 2: Nothing is purged from chat."
    )
