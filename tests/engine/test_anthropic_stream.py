"""Claude's final answer streamed as it is written, through the real SDK against the fake
Messages API's server-sent events, while the decision stays the whole validated reply.

The fake cuts harder than the API: text deltas of three UTF-16 code units (a surrogate
pair's halves in two deltas), tool input JSON cut inside its escapes, each event's bytes
written in two pieces.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from anthropic import AsyncAnthropic

from engine import events as ev
from engine.context import Prompt
from engine.inputs import post_user_message
from engine.models.anthropic import AnthropicModel
from engine.models.base import ModelError
from engine.models.scripted import ScriptedModel, ask, call, say
from engine.replay import replay_all
from engine.runner import Runner
from engine.state import ThreadState
from engine.store import Store, ThreadKey
from tests.fakes.anthropic import (
    FAKE_API_KEY,
    FakeAnthropic,
    Reply,
    json_pieces,
    text_pieces,
)
from tests.support.demo_tools import make_tools
from tests.support.fakes import FakeClock, RecordingModel

RESET = "<reset>"
TOOLS = [
    {
        "name": "lookup",
        "description": "Look something up.",
        "input_schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
    {
        "name": "request_clarification",
        "description": "Ask a clarifying question.",
        "input_schema": {
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "required": ["question"],
        },
    },
]
HELLO = [{"role": "user", "content": [{"type": "text", "text": "[U_ALICE] is the db up?"}]}]
PROMPT = Prompt(system="You are opsloop.", messages=HELLO, tools=TOOLS)
KEY = ThreadKey("T1", "C1", "1700000000.000100")

# Each is one reply's text blocks; the answer is them stripped, joined by a blank line.
HOSTILE = {
    "quotes and backslashes": ['She said "ok" \\ then C:\\temp\\new and \\"x\\"'],
    "literal escapes": ["JSON writes \\u00e9 as \\\\u00e9, and \\ud83d\\ude00 too"],
    "astral and combining": ["up 😀👍🏽 e\u0301 🇫🇷 𝔘𝔫𝔦 done"],
    "pairs at every cut": ["😀😀😀😀😀 a😀😀 ab😀"],
    "newlines and separators": ["  \n line one\r\n\tline two\u2028three\u2029\n\n"],
    "blocks": ["  first part  ", "   ", "\nsecond 😀 part\n", "", "third"],
    "controls": ["nul \x00 bell \x07 del \x7f end"],
}


class Sink:
    """An ``on_text``: every call in order, a reset as ``RESET``."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, delta: str, /, *, reset: bool = False) -> None:
        assert not (reset and delta)
        self.calls.append(RESET if reset else delta)

    @property
    def text(self) -> str:
        """The text standing now: what came after the last reset."""
        return "".join(self.calls).rpartition(RESET)[2]

    @property
    def reset(self) -> bool:
        return RESET in self.calls


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPSLOOP_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as f:
        yield f
    f.assert_clean()


@pytest.fixture
async def model(fake: FakeAnthropic) -> AsyncIterator[AnthropicModel]:
    m = AnthropicModel(
        AsyncAnthropic(api_key=FAKE_API_KEY, base_url=fake.url, max_retries=0, timeout=10)
    )
    yield m
    await m.close()


def has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) < 0xE000 for c in text)


# --- the adapter ----------------------------------------------------------------------


@pytest.mark.parametrize("blocks", list(HOSTILE.values()), ids=list(HOSTILE))
async def test_the_deltas_join_to_exactly_the_answer_and_the_decision_is_the_plain_one(
    fake, model, blocks
):
    reply = Reply(content=[{"type": "text", "text": b} for b in blocks])
    fake.reply(reply).reply(reply)
    plain = await model.next_step(PROMPT)
    sink = Sink()
    streamed = await model.next_step(PROMPT, on_text=sink)

    assert streamed == plain  # text, stop reason, usage, model: the same decision
    assert streamed.text == "\n\n".join(b.strip() for b in blocks if b.strip())
    assert "".join(sink.calls) == streamed.text and not sink.reset
    assert len(sink.calls) > 1  # it did arrive in pieces
    # Never half a character, though the fake cut pairs in two deltas.
    assert not any(has_surrogate(d) for d in sink.calls)
    assert "stream" not in fake.requests[0] and fake.requests[1]["stream"] is True
    assert {k: v for k, v in fake.requests[1].items() if k != "stream"} == fake.requests[0]


def test_the_fake_cuts_where_it_hurts():
    """The hostile texts above are cut between a pair's halves and inside escapes."""
    pieces = text_pieces(HOSTILE["pairs at every cut"][0])
    assert any(0xD800 <= ord(p[-1]) < 0xDC00 for p in pieces)
    raw = json.dumps({"q": 'a"b\\c😀é\n'})
    cut = json_pieces(raw)
    assert "".join(cut) == raw
    assert any(p.endswith("\\") for p in cut)  # right after an escape's backslash
    assert any(re.search(r"\\u[0-9a-f]{0,3}$", p) for p in cut)  # inside a \uXXXX
    assert "\\ud83d\\ude00" in raw and not any("\\ud83d\\ude00" in p for p in cut)


async def test_a_tool_call_streams_nothing_and_its_input_is_read_whole(fake, model):
    hostile = {"name": 'db "main" \\ 😀 é \n \\u0041 end'}
    fake.tool_use("lookup", hostile, id="toolu_1").tool_use("lookup", hostile, id="toolu_1")
    plain = await model.next_step(PROMPT)
    sink = Sink()
    streamed = await model.next_step(PROMPT, on_text=sink)
    assert streamed == plain
    assert streamed.tool_use is not None and streamed.tool_use.input == hostile
    assert sink.calls == []


async def test_a_clarification_streams_nothing(fake, model):
    fake.tool_use("request_clarification", {"question": "Which db?"})
    sink = Sink()
    decision = await model.next_step(PROMPT, on_text=sink)
    assert decision.tool_use is not None and decision.tool_use.input == {"question": "Which db?"}
    assert sink.calls == []


async def test_words_before_a_tool_call_are_streamed_then_reset(fake, model):
    fake.tool_use("lookup", {"name": "db"}, text="Let me look that up.")
    sink = Sink()
    decision = await model.next_step(PROMPT, on_text=sink)
    assert decision.text == "Let me look that up." and decision.tool_use is not None
    assert "".join(sink.calls[:-1]) == "Let me look that up."
    assert sink.calls[-1] == RESET and sink.text == ""


@pytest.mark.parametrize("stop_reason", ["max_tokens", "refusal", "pause_turn"])
async def test_a_reply_that_did_not_end_on_its_own_is_reset(fake, model, stop_reason):
    fake.text("The db is up and the replicas are", stop_reason=stop_reason)
    sink = Sink()
    decision = await model.next_step(PROMPT, on_text=sink)
    assert decision.stop_reason == stop_reason
    assert sink.calls[-1] == RESET and sink.text == ""
    assert "".join(sink.calls[:-1]) == "The db is up and the replicas are"


async def test_a_tool_call_cut_at_max_tokens_resets_its_words(fake, model):
    fake.max_tokens_cut("lookup", {"name": "d"}, text="Checking.")
    sink = Sink()
    decision = await model.next_step(PROMPT, on_text=sink)
    assert decision.stop_reason == "max_tokens" and decision.tool_use is not None
    assert sink.calls == ["Che", "cki", "ng.", RESET]


@pytest.mark.parametrize(
    ("break_with", "retryable", "said"),
    [
        ("overloaded_error", True, "overloaded_error"),
        ("api_error", True, "api_error"),
        ("disconnect", True, "could not reach"),
        ("invalid_request_error", False, "invalid_request_error"),
    ],
)
async def test_a_stream_that_breaks_resets_and_the_next_request_starts_over(
    fake, model, break_with, retryable, said
):
    text = "The db is up: all three replicas answer."
    fake.reply(replace(Reply.text(text), break_after=8, break_with=break_with))
    fake.text(text)
    sink = Sink()
    with pytest.raises(ModelError) as caught:
        await model.next_step(PROMPT, on_text=sink)
    assert caught.value.retryable is retryable and said in str(caught.value)
    assert sink.calls[-1] == RESET and len(sink.calls) > 1
    broken = len(sink.calls)

    decision = await model.next_step(PROMPT, on_text=sink)
    assert decision.text == text
    assert "".join(sink.calls[broken:]) == text  # the retry's text, from its start
    assert sink.text == text


async def test_without_a_sink_the_request_is_not_streamed(model):
    async with FakeAnthropic(streaming=False) as plain:
        m = AnthropicModel(AsyncAnthropic(api_key=FAKE_API_KEY, base_url=plain.url, max_retries=0))
        plain.text("fine")
        assert (await m.next_step(PROMPT)).text == "fine"
        await m.close()
        plain.assert_clean()
    async with FakeAnthropic(streaming=False) as plain:
        m = AnthropicModel(AsyncAnthropic(api_key=FAKE_API_KEY, base_url=plain.url, max_retries=0))
        plain.text("fine")
        with pytest.raises(ModelError, match="400"):
            await m.next_step(PROMPT, on_text=Sink())
        await m.close()
        assert plain.violations == [
            "request 1: stream: this test expects a plain (not streamed) request"
        ]


# --- the runner -----------------------------------------------------------------------


class Door:
    """A front door that shows nothing and keeps what ``answer_text`` got."""

    def __init__(self, *, fails: bool = False) -> None:
        self.sink = Sink()
        self.fails = fails
        self.threads: set[str] = set()

    async def show(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> list[ev.MessagePosted]:
        return []

    async def answer_text(self, thread_id: str, delta: str, *, reset: bool = False) -> None:
        self.threads.add(thread_id)
        if self.fails and not reset:
            raise RuntimeError("slack is down")
        await self.sink(delta, reset=reset)


class Silent:
    """A front door without ``answer_text``."""

    async def show(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> list[ev.MessagePosted]:
        return []


async def start(store: Store, ts: str = KEY.root_ts) -> str:
    key = ThreadKey(KEY.team, KEY.channel, ts)
    return (await post_user_message(store, key, text="is the db up?", user="U_ALICE")).thread_id


def total_input(usage: ev.Usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def of(events: Sequence[ev.AnyEvent], kind: type[ev.Event]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


async def test_the_runner_streams_the_answer_and_logs_the_decision_a_plain_call_would(
    store, fake, model
):
    answer = 'The db is up 😀: "primary" \\ replicas\n- a\n- b'
    for _ in range(2):
        fake.tool_use("lookup", {"name": "db"}, text="Looking.", id="toolu_db").text(answer)
    tools = make_tools(Counter())
    door = Door()
    streamed = await start(store, "1700000000.000100")
    assert (await Runner(store, model, tools, front_door=door).run(streamed)).status == "idle"
    plain = await start(store, "1700000000.000200")
    assert (await Runner(store, model, tools, front_door=Silent()).run(plain)).status == "idle"

    assert [bool(r.get("stream")) for r in fake.requests] == [True, True, False, False]
    a, b = await store.select_events(streamed), await store.select_events(plain)
    assert [e.type for e in a] == [e.type for e in b]
    fields = ("text", "tool_name", "arguments", "stop_reason", "prompt_hash", "tools_hash")
    for x, y in zip(of(a, ev.ModelDecision), of(b, ev.ModelDecision), strict=True):
        assert {f: getattr(x, f) for f in fields} == {f: getattr(y, f) for f in fields}
        # The same tokens (the second thread reads the first one's prompt cache).
        assert x.usage.output_tokens == y.usage.output_tokens
        assert total_input(x.usage) == total_input(y.usage)
    [final] = of(a, ev.FinalAnswer)
    assert final.text == answer == door.sink.text
    assert "".join(door.sink.calls) == "Looking." + RESET + answer  # the words were reset
    assert door.threads == {streamed}
    replayed = replay_all(a, list(tools))
    assert len(replayed) == 2 and all(r.matches for r in replayed)


async def test_a_cut_tool_call_is_never_run_and_its_words_are_reset(store, fake, model):
    fake.max_tokens_cut("lookup", {"name": "d"}, text="Checking the db.")
    fake.text("I could not finish that call.")
    effects: Counter = Counter()
    door = Door()
    tid = await start(store)
    state = await Runner(store, model, make_tools(effects), front_door=door).run(tid)
    assert state.status == "idle"
    assert effects["lookup"] == 0
    events = await store.select_events(tid)
    assert [e.type for e in events] == [
        "user_message", "model_decision", "decision_rejected", "model_decision", "final_answer",
    ]  # fmt: skip
    assert door.sink.calls.count(RESET) == 1
    assert "".join(door.sink.calls) == "Checking the db." + RESET + "I could not finish that call."


async def test_a_failed_call_resets_and_its_retry_streams_anew(store, fake, model):
    clock = FakeClock()
    answer = "All three replicas answer."
    fake.reply(replace(Reply.text(answer), break_after=7))
    door = Door()
    runner = Runner(store, model, make_tools(Counter()), clock=clock, front_door=door)
    tid = await start(store)
    assert (await runner.run(tid)).status == "sleeping"
    assert (await store.select_events(tid))[-1].type == "retry_scheduled"
    assert door.sink.calls[-1] == RESET and door.sink.text == ""
    broken = len(door.sink.calls)

    clock.advance(60)
    fake.text(answer)
    assert (await runner.run(tid)).status == "idle"
    assert "".join(door.sink.calls[broken:]) == answer
    assert (await store.select_events(tid))[-1].text == answer


async def test_a_front_door_that_fails_to_stream_never_stops_the_run(store, fake, model):
    fake.text("The db is up.")
    door = Door(fails=True)
    tid = await start(store)
    assert (
        await Runner(store, model, make_tools(Counter()), front_door=door).run(tid)
    ).status == "idle"
    assert (await store.select_events(tid))[-1].text == "The db is up."
    assert len(fake.requests) == 1


async def test_the_scripted_model_hands_its_answer_over_in_one_piece(store):
    door = Door()
    script = [call("lookup", name="db"), ask("Which db?")]
    tid = await start(store)
    runner = Runner(store, ScriptedModel(script), make_tools(Counter()), front_door=door)
    assert (await runner.run(tid)).status == "awaiting_reply"
    assert door.sink.calls == []  # a tool call and a question: nothing streamed

    door2 = Door()
    tid2 = await start(store, "1700000000.000300")
    runner = Runner(
        store, ScriptedModel([say("  The db is up.  ")]), make_tools(Counter()), front_door=door2
    )
    assert (await runner.run(tid2)).status == "idle"
    assert door2.sink.calls == ["  The db is up.  "]
    assert (await store.select_events(tid2))[-1].text == "  The db is up.  "


async def test_a_model_without_on_text_is_called_as_before(store):
    door = Door()
    model = RecordingModel([say("The db is up.")])
    tid = await start(store)
    assert (
        await Runner(store, model, make_tools(Counter()), front_door=door).run(tid)
    ).status == "idle"
    assert door.sink.calls == [] and len(model.prompts) == 1


async def test_a_retry_after_the_wait_gets_a_fresh_stream_through_the_clock(store, fake, model):
    """The runner's own retry (a ``retry_scheduled`` in the log), not a hidden one."""
    clock = FakeClock()
    fake.reply(replace(Reply.text("x"), break_after=3, break_with="disconnect"))
    door = Door()
    runner = Runner(store, model, make_tools(Counter()), clock=clock, front_door=door)
    tid = await start(store)
    assert (await runner.run(tid)).status == "sleeping"
    [retry] = of(await store.select_events(tid), ev.RetryScheduled)
    assert retry.wake_at > clock.now
    assert len(fake.requests) == 1  # no SDK retry behind our back
    clock.now = retry.wake_at + timedelta(seconds=1)
    fake.text("fine")
    assert (await runner.run(tid)).status == "idle"
    assert door.sink.text == "fine"
