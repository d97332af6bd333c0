"""The runner driving threads with Claude (``AnthropicModel``) through the fake
Messages API, with the real SDK, on SQLite and PostgreSQL.

The fake refuses (and records) any request the real API would refuse, so every test
also proves the projection sends well-formed conversations: alternating roles, every
tool_use answered by its tool_result in the next user turn.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from engine.inputs import Decider, decide_approval, post_user_message
from engine.models.anthropic import DEFAULT_MODEL, AnthropicModel
from engine.replay import replay_all
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic
from tests.support.demo_tools import make_tools
from tests.support.fakes import FakeClock

KEY = ThreadKey("T1", "C1", "1700000000.000100")
BAD_KEY = "sk-ant-api03-" + "WrongWrong" * 5


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPSLOOP_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as f:
        yield f
    f.assert_clean()


async def claude(fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, key: str) -> AnthropicModel:
    """The model as `opsloop serve` builds it: from the environment."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    return AnthropicModel.from_env()


@pytest.fixture
async def model(fake: FakeAnthropic, monkeypatch) -> AsyncIterator[AnthropicModel]:
    m = await claude(fake, monkeypatch, FAKE_API_KEY)
    yield m
    await m.close()


async def start(store: Store, text: str = "please check the db") -> str:
    accepted = await post_user_message(store, KEY, text=text, user="U_ALICE", dedupe_key="m1")
    return accepted.thread_id


async def types_of(store: Store, thread_id: str) -> list[str]:
    return [e.type for e in await store.select_events(thread_id)]


def tool_use_id(fake: FakeAnthropic, n: int) -> str:
    """The id of the tool_use the fake answered with in its n-th reply (0-based)."""
    status, body = fake.responses[n]
    assert status == 200
    return next(b["id"] for b in body["content"] if b["type"] == "tool_use")


def answer_to(request: dict[str, Any], call_id: str) -> dict[str, Any]:
    """The tool_result for ``call_id`` in the request's last (user) message; it must come
    right after the assistant turn that holds the tool_use."""
    messages = request["messages"]
    assert messages[-1]["role"] == "user"
    uses = [b for b in messages[-2]["content"] if b["type"] == "tool_use"]
    assert [u["id"] for u in uses] == [call_id]
    results = [b for b in messages[-1]["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [call_id]
    return results[0]


def result_text(result: dict[str, Any]) -> str:
    content = result.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content)


async def test_tool_use_then_final_answer(store, fake, model):
    fake.tool_use("lookup", {"name": "db"}, text="Let me look that up.")
    fake.text("The db is there.")
    effects: Counter = Counter()
    tid = await start(store)
    state = await Runner(store, model, make_tools(effects)).run(tid)
    assert state.status == "idle"
    assert effects["lookup"] == 1
    assert await types_of(store, tid) == [
        "user_message", "model_decision", "tool_call_requested", "tool_started",
        "tool_result", "model_decision", "final_answer",
    ]  # fmt: skip
    call_id = tool_use_id(fake, 0)
    result = answer_to(fake.requests[1], call_id)
    assert json.loads(result_text(result)) == {"found": "db"}
    assert not result.get("is_error")

    events = await store.select_events(tid)
    decisions = [e for e in events if e.type == "model_decision"]
    assert decisions[0].tool_call_id == call_id
    assert decisions[0].text == "Let me look that up."
    assert [d.model for d in decisions] == [DEFAULT_MODEL, DEFAULT_MODEL]
    requested = next(e for e in events if e.type == "tool_call_requested")
    assert requested.idempotency_key == f"{tid}:{call_id}"
    for decision, (_, reply) in zip(decisions, fake.responses, strict=True):
        usage = reply["usage"]
        assert decision.usage.input_tokens == usage["input_tokens"]
        assert decision.usage.output_tokens == usage["output_tokens"]
        assert decision.usage.cache_read_input_tokens == usage["cache_read_input_tokens"]
        assert decision.usage.cache_creation_input_tokens == usage["cache_creation_input_tokens"]
    # The stable prefix (system and tools) was cached by the first call, read by the second.
    assert decisions[1].usage.cache_read_input_tokens > 0
    assert events[-1].text == "The db is there."
    await assert_replays_what_was_sent(store, tid, fake, make_tools(Counter()))


async def test_approval_then_approve_runs_the_tool(store, fake, model):
    fake.tool_use("deploy", {"name": "api"}, text="Deploying api to staging, as asked.")
    effects: Counter = Counter()
    runner = Runner(store, model, make_tools(effects))
    tid = await start(store, "deploy api to staging")
    state = await runner.run(tid)
    assert state.status == "awaiting_approval"
    assert effects["deploy"] == 0
    asked = next(e for e in await store.select_events(tid) if e.type == "approval_requested")
    assert asked.reason == "Deploying api to staging, as asked."
    assert len(fake.requests) == 1  # nothing is asked while the call waits for a human

    res = await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="approve", reviewers=ReviewerRule(),
    )  # fmt: skip
    assert res.event.type == "approval_granted"
    fake.text("api is deployed to staging.")
    state = await runner.run(tid)
    assert state.status == "idle"
    assert effects["deploy"] == 1
    result = answer_to(fake.requests[1], tool_use_id(fake, 0))
    assert json.loads(result_text(result)) == {"deployed": "api"}
    await assert_replays_what_was_sent(store, tid, fake, make_tools(Counter()))


async def assert_replays_what_was_sent(store, thread_id, fake, tools) -> None:
    """`opsloop replay` recomputes, from the log alone, exactly the bodies Claude got."""
    replayed = replay_all(await store.select_events(thread_id), list(tools))
    assert replayed and all(r.matches for r in replayed)
    assert len(replayed) == len(fake.requests)
    for r, sent in zip(replayed, fake.requests, strict=True):
        assert {k: sent[k] for k in ("system", "tools", "messages")} == r.prompt.body()


async def test_a_rejection_with_reason_reaches_the_model(store, fake, model):
    fake.tool_use("deploy", {"name": "api"}, text="Deploying api.")
    effects: Counter = Counter()
    runner = Runner(store, model, make_tools(effects))
    tid = await start(store, "deploy api")
    state = await runner.run(tid)
    assert state.status == "awaiting_approval"
    await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="reject", reason="freeze until Monday", reviewers=ReviewerRule(),
    )  # fmt: skip
    fake.text("Understood, not deploying until Monday.")
    state = await runner.run(tid)
    assert state.status == "idle"
    assert effects["deploy"] == 0
    result = answer_to(fake.requests[1], tool_use_id(fake, 0))
    assert result["is_error"] is True
    assert "U_BOB" in result_text(result)
    assert "freeze until Monday" in result_text(result)


async def test_a_clarification_is_answered_by_the_next_reply(store, fake, model):
    fake.tool_use("request_clarification", {"question": "Which environment?"})
    runner = Runner(store, model, make_tools(Counter()))
    tid = await start(store, "deploy api")
    state = await runner.run(tid)
    assert state.status == "awaiting_reply"
    assert state.question.question == "Which environment?"
    reply = await post_user_message(store, KEY, text="staging", user="U_ALICE", dedupe_key="m2")
    assert reply.event.type == "clarification_answered"
    fake.text("Staging it is.")
    assert (await runner.run(tid)).status == "idle"
    result = answer_to(fake.requests[1], tool_use_id(fake, 0))
    assert "staging" in result_text(result)
    assert not result.get("is_error")


async def test_overload_schedules_a_retry_in_the_log_then_succeeds(store, fake, model):
    clock = FakeClock()
    fake.error(529, "overloaded_error", "Overloaded", retry_after=1)
    runner = Runner(store, model, make_tools(Counter()), clock=clock)
    tid = await start(store)
    state = await runner.run(tid)
    assert state.status == "sleeping"
    retry = (await store.select_events(tid))[-1]
    assert retry.type == "retry_scheduled"
    assert retry.tool_call_id is None  # the model call, not a tool
    assert retry.attempt == 1
    assert retry.wake_at == clock.now + timedelta(seconds=1)
    assert "overloaded" in retry.error and "529" in retry.error
    assert (await store.get_thread(tid)).wake_at == retry.wake_at
    assert await store.due_threads(clock()) == []
    assert len(fake.requests) == 1  # no hidden SDK retry

    clock.advance(1.5)
    assert await store.due_threads(clock()) == [tid]
    fake.text("All good now.")
    state = await runner.run(tid)
    assert state.status == "idle"
    assert fake.requests[1] == fake.requests[0]  # the same prompt, byte for byte
    assert (await store.select_events(tid))[-1].type == "final_answer"


async def test_an_invalid_key_fails_the_thread_without_showing_the_key(store, fake, monkeypatch):
    model = await claude(fake, monkeypatch, BAD_KEY)
    try:
        tid = await start(store)
        state = await Runner(store, model, make_tools(Counter())).run(tid)
    finally:
        await model.close()
    assert state.status == "failed"
    events = await store.select_events(tid)
    error = events[-1]
    assert error.type == "error"
    assert "ANTHROPIC_API_KEY" in error.message and "401" in error.message
    assert "retry_scheduled" not in [e.type for e in events]
    log = json.dumps([e.model_dump(mode="json") for e in events])
    assert "WrongWrong" not in log and "sk-ant" not in log
    assert len(fake.requests) == 1


async def test_a_tool_call_cut_at_max_tokens_is_rejected_and_never_runs(store, fake, model):
    fake.max_tokens_cut("lookup", {"name": "d"}, text="Looking up")
    fake.text("My reply was cut off; nothing ran. Shall I try again?")
    effects: Counter = Counter()
    tid = await start(store)
    state = await Runner(store, model, make_tools(effects)).run(tid)
    assert state.status == "idle"
    assert effects["lookup"] == 0
    types = await types_of(store, tid)
    assert "decision_rejected" in types
    assert "tool_started" not in types and "tool_call_requested" not in types
    rejected = next(e for e in await store.select_events(tid) if e.type == "decision_rejected")
    assert "max_tokens" in rejected.reason
    result = answer_to(fake.requests[1], tool_use_id(fake, 0))
    assert result["is_error"] is True
    assert "max_tokens" in result_text(result)
