"""Context projection: every legal log becomes a well-formed Messages API conversation,
the same log always gives the same bytes, and a different log a different hash."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from pydantic import BaseModel

from engine import events as ev
from engine.context import (
    MAX_RESULT_CHARS,
    PROJECTION_VERSION,
    PROJECTIONS,
    SYSTEM_PROMPT,
    Projector,
    alert_text,
    project,
)
from tests.support.logs import (
    OTHER,
    PROPERTY,
    REQUESTER,
    REVIEWER,
    answered,
    approval_pending,
    clarification_asked,
    decided,
    edited,
    happy_path,
    legal_logs,
    requested,
    result,
    said,
    stamp,
    started,
    user,
)
from tools import ToolContext, ToolRegistry, tool
from tools.output import MAX_IMAGE_BYTES

TOOLS = ToolRegistry()


class Target(BaseModel):
    target: str = ""


@tool(registry=TOOLS)
async def lookup(args: Target, ctx: ToolContext) -> dict:
    """Look something up."""
    return {}


@tool(policy="approve_before_run", registry=TOOLS)
async def deploy(args: Target, ctx: ToolContext) -> dict:
    """Deploy something."""
    return {}


@tool(policy="wait_for_external_event", registry=TOOLS)
async def build(args: Target, ctx: ToolContext) -> dict:
    """Build something."""
    return {}


@dataclass(frozen=True)
class Spec:
    """A tool as the projection sees it, schema computed once (keeps properties fast)."""

    name: str
    description: str
    policy: str
    schema: dict[str, Any]

    def input_schema(self) -> dict[str, Any]:
        return self.schema


SPECS = [Spec(t.name, t.description, t.policy, t.input_schema()) for t in TOOLS.all()]


# The events that give a tool_use its tool_result: those naming the call, and the two
# that close whatever call is open.
ANSWERS_BY_ID = {
    "decision_rejected",
    "approval_rejected",
    "approval_expired",
    "approval_withdrawn",
    "tool_result",
    "wait_finished",
    "wait_timed_out",
    "clarification_answered",
}
ANSWERS_OPEN = {"thread_cancelled", "error"}


def answers(e: ev.Event) -> bool:
    """Does ``e`` close its call in the prompt (beyond the types above)?"""
    if isinstance(e, ev.ToolCallRequested):
        return e.policy == "reject"  # a rule refused it: answered at once
    if isinstance(e, ev.ReconcileDecided):
        return e.decision != "retry"  # a retry runs it again: still open
    if isinstance(e, ev.ApprovalEdited):
        return e.policy == "reject"  # the policy refuses the edited call: answered at once
    return e.type in ANSWERS_BY_ID


def answered_calls(log: list[ev.Event]) -> set[str]:
    """Ids of tool uses whose outcome is in the log (computed from the log, not the prompt)."""
    done: set[str] = set()
    open_call: str | None = None
    running: str | None = None  # a stop waits for a running call's own result
    for e in log:
        if isinstance(e, ev.ToolStarted):
            running = e.tool_call_id
        elif isinstance(e, ev.RetryScheduled | ev.ToolOutcomeUnknown):
            running = None
        if isinstance(e, ev.ModelDecision) and e.tool_name and e.tool_call_id:
            open_call = e.tool_call_id
        elif open_call is not None and (
            e.type in ANSWERS_OPEN
            or (answers(e) and getattr(e, "tool_call_id", None) == open_call)
            or (isinstance(e, ev.StopRequested) and running != open_call)
        ):
            done.add(open_call)
            open_call = None
    return done


def tool_uses(message: dict[str, Any]) -> list[str]:
    return [b["id"] for b in message["content"] if b["type"] == "tool_use"]


def tool_results(message: dict[str, Any]) -> list[str]:
    return [b["tool_use_id"] for b in message["content"] if b["type"] == "tool_result"]


@PROPERTY
@given(log=legal_logs(max_size=40))
def test_projection_is_a_well_formed_conversation(log: list[ev.Event]) -> None:
    messages = project(log, SPECS).messages
    assert messages and messages[0]["role"] == "user"
    compactions = [e for e in log if isinstance(e, ev.ContextCompacted)]
    if compactions:  # the latest summary stands for everything before its boundary
        first = {"type": "text", "text": compactions[-1].summary}
    elif isinstance(log[0], ev.AlertReceived):
        first = {"type": "text", "text": alert_text(log[0])}
    else:
        first = {"type": "text", "text": f"[{log[0].actor}] {log[0].text}"}
    assert messages[0]["content"][0] == first
    for before, after in itertools.pairwise(messages):
        assert before["role"] != after["role"], "roles alternate"
    for message in messages:
        assert message["content"], "no empty turn"
        if message["role"] == "assistant":
            assert len(tool_uses(message)) <= 1
            assert not tool_results(message)
        else:
            assert not tool_uses(message)

    done = answered_calls(log)
    used = [(i, cid) for i, m in enumerate(messages) for cid in tool_uses(m)]
    assert len({cid for _, cid in used}) == len(used), "tool_use ids are unique"
    for i, cid in used:
        if cid in done:
            reply = messages[i + 1]
            assert reply["role"] == "user"
            # A tool_result leads the next user turn; what people said meanwhile follows.
            assert reply["content"][0]["type"] == "tool_result"
            assert reply["content"][0]["tool_use_id"] == cid
        else:
            assert i == max(j for j, _ in used), "only the last call can still be open"
            assert all(cid not in tool_results(m) for m in messages)
    for i, message in enumerate(messages):
        for cid in tool_results(message):
            assert cid in tool_uses(messages[i - 1]), "a result answers the turn before it"


@PROPERTY
@given(log=legal_logs(max_size=40))
def test_projection_is_deterministic(log: list[ev.Event]) -> None:
    first = project(log, SPECS)
    # Same log rebuilt from JSON, tools given in another order: same bytes, same hash.
    again = project([ev.parse_event(e.model_dump(mode="json")) for e in log], SPECS[::-1])
    assert json.dumps(first.body(), sort_keys=True) == json.dumps(again.body(), sort_keys=True)
    assert first.hash == again.hash
    assert len(first.hash) == 64 and first.version == PROJECTION_VERSION
    assert project(log, SPECS, version="v-next").hash != first.hash


@PROPERTY
@given(log=legal_logs(max_size=40))
def test_a_prompt_taken_after_each_event_is_the_projection_of_that_prefix(
    log: list[ev.Event],
) -> None:
    """The runner's projector gives a prompt after every step and shares the settled
    messages with it: neither its cache breakpoint nor what people said while a call
    was open may stay behind in the projector for the next prompt."""
    projector = Projector(SPECS)
    for n, event in enumerate(log, start=1):
        prompt = projector.feed([event]).prompt()
        whole = project(log[:n], SPECS)
        assert prompt.body() == whole.body()
        assert prompt.hash == whole.hash


@PROPERTY
@given(log=legal_logs(max_size=40))
def test_a_different_log_gives_a_different_hash(log: list[ev.Event]) -> None:
    base = project(log, SPECS).hash
    if not any(isinstance(e, ev.ContextCompacted) for e in log):
        # (a compaction's stored summary stands for the first message from then on)
        said = "summary" if isinstance(log[0], ev.AlertReceived) else "text"
        edited = [log[0].model_copy(update={said: getattr(log[0], said) + "!"}), *log[1:]]
        assert project(edited, SPECS).hash != base
        other_actor = [log[0].model_copy(update={"actor": "U0THIRD"}), *log[1:]]
        assert project(other_actor, SPECS).hash != base
    longer = [*log, user("one more", actor=OTHER)]
    assert project(longer, SPECS).hash != base
    assert project(log, SPECS[:1]).hash != base


def test_golden_conversation() -> None:
    log = stamp(
        [
            user("deploy api to staging"),
            decided("toolu_1", "lookup", text="Checking first.", target="api"),
            requested("toolu_1", "lookup", target="api"),
            started("toolu_1"),
            user("hurry please", actor=OTHER),
            result("toolu_1", output={"version": "1.2", "healthy": True}),
            *approval_pending("toolu_2"),
            ev.ApprovalRejected(actor=REVIEWER, tool_call_id="toolu_2", reason="freeze"),
            *clarification_asked("toolu_3", "Which region?"),
            ev.ClarificationAnswered(actor=REQUESTER, tool_call_id="toolu_3", text="eu"),
            said(""),
            ev.DecisionRejected(reason="the reply was empty"),
            *answered("Not deployed: there is a freeze."),
        ]
    )
    prompt = project(log, TOOLS.all())
    cache = {"type": "ephemeral"}  # prompt-cache breakpoints: system, tools, the last turn
    assert prompt.system == [{"type": "text", "text": SYSTEM_PROMPT, "cache_control": cache}]
    assert [t["name"] for t in prompt.tools] == ["build", "deploy", "lookup", ev.CLARIFICATION_TOOL]
    assert [t.get("cache_control") for t in prompt.tools] == [None, None, None, cache]
    assert prompt.tools[2]["description"] == "Look something up."
    assert prompt.tools[2]["input_schema"]["properties"] == {
        "target": {"default": "", "title": "Target", "type": "string"}
    }
    assert prompt.messages == [
        {
            "role": "user",
            "content": [{"type": "text", "text": f"[{REQUESTER}] deploy api to staging"}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking first."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"target": "api"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": '{"healthy": true, "version": "1.2"}',
                },
                {"type": "text", "text": f"[{OTHER}] hurry please"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "I will deploy."},
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "deploy",
                    "input": {"service": "api", "env": "staging"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": f"Reviewer {REVIEWER} rejected this call: freeze",
                    "is_error": True,
                }
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_3",
                    "name": ev.CLARIFICATION_TOOL,
                    "input": {"question": "Which region?"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_3", "content": f"[{REQUESTER}] eu"}
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "(empty reply)"}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Rejected by validation: the reply was empty",
                    "cache_control": cache,
                }
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Not deployed: there is a freeze."}],
        },
    ]


def test_people_speaking_while_a_call_is_open_are_shown_after_it() -> None:
    log = [*happy_path()[:4], user("still there?", actor=OTHER)]  # lookup started, no result
    messages = project(log, TOOLS.all()).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[-1]["content"] == [{"type": "text", "text": f"[{OTHER}] still there?"}]


def test_cancel_answers_the_open_call() -> None:
    log = [user(), *approval_pending("toolu_2"), ev.ThreadCancelled(actor=REQUESTER, reason="nvm")]
    last = project(log, TOOLS.all()).messages[-1]
    assert last["role"] == "user"
    assert last["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "content": f"Not run: <@{REQUESTER}> cancelled this thread: nvm",
            "is_error": True,
        }
    ]  # said once: the note closes the call instead of being repeated as text


def test_large_tool_output_is_elided() -> None:
    big = {"rows": ["x" * 100] * 100}
    log = [user(), *happy_path()[1:3], started("toolu_1"), result("toolu_1", output=big)]
    content = project(log, TOOLS.all()).messages[-1]["content"][0]["content"]
    full = len(json.dumps(big, sort_keys=True))
    assert full > MAX_RESULT_CHARS
    assert len(content) < MAX_RESULT_CHARS + 200
    assert f"[{full} chars; elided, full output in event " in content


def test_elided_output_points_at_its_event() -> None:
    big = {"rows": ["x" * 100] * 100}
    log = stamp([user(), *happy_path()[1:3], started("toolu_1"), result("toolu_1", output=big)])
    content = project(log, TOOLS.all()).messages[-1]["content"][0]["content"]
    assert log[-1].event_id in content or f"seq {log[-1].seq}" in content


def test_failed_tool_result_is_an_error_result() -> None:
    log = [user(), *happy_path()[1:4], result("toolu_1", ok=False)]
    block = project(log, TOOLS.all()).messages[-1]["content"][0]
    assert block == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "Tool failed: boom",
        "is_error": True,
    }


@PROPERTY
@given(log=legal_logs(max_size=40))
def test_tools_offered_anew_give_the_prompt_a_projection_with_them_gives(
    log: list[ev.Event],
) -> None:
    """A tool source changed its tools while the thread ran (issue 16 §1): the runner's
    projector is offered them, and the next prompt is the one made with them from the
    start, hash included; the one before was that of the old tools."""
    fewer = SPECS[:1]
    half = len(log) // 2
    projector = Projector(fewer).feed(log[:half])
    assert projector.prompt().hash == project(log[:half], fewer).hash
    prompt = projector.offer(SPECS).feed(log[half:]).prompt()
    whole = project(log, SPECS)
    assert prompt.body() == whole.body()
    assert (prompt.hash, prompt.tool_names, prompt.tools_hash) == (
        whole.hash,
        whole.tool_names,
        whole.tools_hash,
    )


@PROPERTY
@given(log=legal_logs(min_size=8, max_size=60))
def test_a_projection_resumed_at_a_compaction_equals_the_whole_fold(log: list[ev.Event]) -> None:
    compactions = [e for e in log if isinstance(e, ev.ContextCompacted)]
    whole = project(log, SPECS)
    if not compactions:
        return
    last = compactions[-1]
    resumed = Projector(SPECS).resume(last).feed(e for e in log if e.seq > last.upto_seq)
    prompt = resumed.prompt()
    assert prompt.messages == whole.messages
    assert prompt.hash == whole.hash


@PROPERTY
@given(log=legal_logs(min_size=1, max_size=50))
def test_every_prompt_the_model_would_get_is_a_request_the_api_accepts(log: list[ev.Event]) -> None:
    from datetime import UTC, datetime

    from engine.state import next_action, reduce
    from tests.fakes.anthropic import check_request

    state = reduce(log)
    far = datetime(2100, 1, 1, tzinfo=UTC)  # every timer due
    if next_action(state, far) != "ask_model":
        return  # the model is only asked in these states
    prompt = project(log, SPECS)
    body = {"model": "claude-sonnet-5-5", "max_tokens": 1024, **prompt.body()}
    body["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
    assert check_request(body) == []
    assert project(log, SPECS).hash == prompt.hash  # and twice the same bytes


# --- what people wrote, as they saw it (chat markup) -----------------------------------

SLACK = {"kind": "slack", "channel": "C0OPS", "ts": "1.0", "names": {"U0BOB": "bob"}}
SENT = "ask <@U0BOB> in <#C0OPS|ops>: is <https://x.example/a?b=1&amp;c=2|the runbook> &lt;ok&gt;?"
SHOWN = "ask @bob in #ops: is the runbook (https://x.example/a?b=1&c=2) <ok>?"


def first_text(prompt: Any) -> str:
    return prompt.messages[0]["content"][0]["text"]


def test_slack_markup_is_decoded_for_the_model_and_kept_in_the_log() -> None:
    message = user(SENT, source=SLACK)
    prompt = project(stamp([message]), SPECS)
    assert first_text(prompt) == f"[{REQUESTER}] {SHOWN}"
    assert message.text == SENT  # the log keeps what Slack sent
    assert "<@U0ALICE> &amp;" in first_text(
        project(stamp([user("<@U0ALICE> &amp;")]), SPECS)
    )  # no source: not known to be Slack's markup, shown as written


def test_a_mention_without_a_name_shows_the_id() -> None:
    prompt = project(stamp([user("ping <@U0CAROL> <!here>", source={"kind": "slack"})]), SPECS)
    assert first_text(prompt) == f"[{REQUESTER}] ping @U0CAROL @here"


def test_a_clarification_answer_from_slack_is_decoded() -> None:
    log = stamp(
        [
            user("deploy", source=SLACK),
            *clarification_asked("toolu_1", "Which env?"),
            ev.ClarificationAnswered(
                actor=REQUESTER, tool_call_id="toolu_1", text="ask <@U0BOB> &amp; go", source=SLACK
            ),
        ]
    )
    reply = project(log, SPECS).messages[-1]["content"][0]
    assert reply == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": f"[{REQUESTER}] ask @bob & go",
    }


def test_projection_v1_keeps_the_words_verbatim_for_replays() -> None:
    log = stamp([user(SENT, source=SLACK)])
    assert PROJECTION_VERSION != "v1"
    old = project(log, SPECS, version="v1")
    assert first_text(old) == f"[{REQUESTER}] {SENT}"
    assert old.hash != project(log, SPECS).hash


def test_a_compaction_summary_shows_decoded_words() -> None:
    projector = Projector(SPECS).feed(stamp([user(SENT, source=SLACK), *answered("ok")]))
    summary = projector.digest.summary(2)
    assert SHOWN in summary and SENT not in summary


def test_the_prompt_carries_the_tools_fingerprint() -> None:
    prompt = project(stamp([user()]), SPECS)
    assert prompt.tool_names == ("build", "deploy", "lookup")
    assert len(prompt.tools_hash) == 64
    assert project(stamp([user("other words")]), SPECS[::-1]).tools_hash == prompt.tools_hash
    fewer = project(stamp([user()]), SPECS[:2])
    assert fewer.tool_names == ("build", "deploy") and fewer.tools_hash != prompt.tools_hash
    described = [Spec(s.name, s.description + "!", s.policy, s.schema) for s in SPECS]
    assert project(stamp([user()]), described).tools_hash != prompt.tools_hash


def test_every_type_the_model_sees_has_a_projection_branch_and_no_other_does() -> None:
    # A compaction is no branch: the Projector replaces earlier messages by its summary.
    seen = [c for c in ev.EVENT_CLASSES if c.facts.model and c is not ev.ContextCompacted]
    assert ev.missing_from(PROJECTIONS, seen) == []
    assert set(PROJECTIONS) == set(seen)


def test_the_model_hears_who_changed_its_arguments_and_what_ran() -> None:
    """Issue 17 §2: the tool_use keeps the model's arguments; the result says who
    changed what before it ran, and with what it ran."""
    pending = approval_pending("toolu_2")  # deploy(service=api, env=staging)
    asked = pending[-1]
    assert isinstance(asked, ev.ApprovalRequested)
    first = edited("deploy", "toolu_2", asked.arguments_hash, service="api", env="production")
    second = edited("deploy", "toolu_2", first.arguments_hash, service="web", env="production")
    second = second.model_copy(update={"actor": OTHER, "reviewer": OTHER})
    log = [
        user(),
        *pending,
        first,
        second,
        ev.ApprovalGranted(actor=REVIEWER, tool_call_id="toolu_2"),
        started("toolu_2"),
        result("toolu_2", output={"deployed": "web"}),
    ]
    messages = project(log, TOOLS.all()).messages
    [use] = [b for b in messages[1]["content"] if b["type"] == "tool_use"]
    assert use["input"] == {"service": "api", "env": "staging"}  # as the model wrote it
    [answer] = messages[-1]["content"]
    assert answer["tool_use_id"] == "toolu_2" and "is_error" not in answer
    assert answer["content"] == (
        f"<@{REVIEWER}> changed env: staging → production; <@{OTHER}> changed service: api → "
        'web before it was approved; it ran with {"env": "production", "service": "web"}.\n'
        '{"deployed": "web"}'
    )


def test_an_edit_the_policy_refuses_answers_the_call() -> None:
    pending = approval_pending("toolu_2")
    asked = pending[-1]
    assert isinstance(asked, ev.ApprovalRequested)
    refused = edited("deploy", "toolu_2", asked.arguments_hash, "reject", env="prod-eu")
    [answer] = project([user(), *pending, refused], TOOLS.all()).messages[-1]["content"]
    assert answer["is_error"] is True
    assert answer["content"] == (
        f"<@{REVIEWER}> changed service: api → (unset); env: staging → prod-eu before anyone "
        'approved it; its arguments were then {"env": "prod-eu"}.\n'
        "Not run: the policy refuses the edited call: the policy refuses it"
    )


def test_a_message_written_while_a_reconcile_card_waits_is_read_after_its_answer() -> None:
    """README ("In Slack"): a reconcile card is never withdrawn; a message written while
    it waits reaches the model right after the person's answer, not lost, not before it."""
    call = requested("toolu_1", "lookup", q="api").model_copy(update={"idempotent": False})
    log = [
        user("restart api"),
        decided("toolu_1", "lookup", q="api"),
        call,
        started("toolu_1"),
        ev.ToolOutcomeUnknown(tool_call_id="toolu_1", attempt=1, error="connection lost"),
        user("actually, check web too"),
        ev.ReconcileDecided(
            actor=REVIEWER, tool_call_id="toolu_1", decision="happened", reviewer=REVIEWER
        ),
    ]
    answer, said_meanwhile = project(stamp(log), TOOLS.all()).messages[-1]["content"]
    assert answer["type"] == "tool_result" and "says it happened" in answer["content"]
    assert said_meanwhile["text"].endswith("actually, check web too")


# --- an MCP result's images and resources (issue 16 §7) --------------------------------

PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def answered_with(output: Any) -> Any:
    log = [user(), *happy_path()[1:3], started("toolu_1"), result("toolu_1", output=output)]
    return project(log, TOOLS.all()).messages[-1]["content"][0]["content"]


def test_an_mcp_image_with_its_data_is_an_image_block_after_the_text() -> None:
    image = {"type": "image", "mime_type": "image/png", "bytes": 69, "data": PNG_B64}
    text, block = answered_with({"text": "a chart", "attachments": [image]})
    assert block == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
    }
    summary = {"type": "image", "mime_type": "image/png", "bytes": 69}
    assert json.loads(text["text"]) == {"text": "a chart", "attachments": [summary]}


def test_only_an_mcp_result_with_an_image_the_api_takes_gets_an_image_block() -> None:
    tiff = {"type": "image", "mime_type": "image/tiff", "bytes": 3, "data": "AAAA"}
    not_mcp = {"rows": 1, "attachments": [{**tiff, "mime_type": "image/png"}]}
    assert isinstance(answered_with(not_mcp), str)  # a tool's own JSON, as it is
    shown = answered_with({"attachments": [tiff]})
    assert json.loads(shown) == {"attachments": [{k: v for k, v in tiff.items() if k != "data"}]}
    huge = {**tiff, "mime_type": "image/png", "data": "A" * (MAX_IMAGE_BYTES * 2)}
    assert isinstance(answered_with({"attachments": [huge]}), str)


def test_an_embedded_text_resource_is_inline_within_the_cut() -> None:
    resource = {"type": "resource", "uri": "file:///r.txt", "bytes": 9000, "text": "y" * 9000}
    content = answered_with({"attachments": [resource]})
    assert '"text": "yyyy' in content
    assert len(content) < MAX_RESULT_CHARS + 200
    assert "chars; elided, full output in event " in content
