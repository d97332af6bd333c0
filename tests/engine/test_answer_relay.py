"""The relay of a streamed reply's text: however the deltas are cut, what it sends joins
to exactly the text the decision will hold, and never holds half a character."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given
from hypothesis import strategies as st

from engine.models.answer_relay import AnswerRelay, paired

RESET = "<reset>"


class Sink:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, delta: str, /, *, reset: bool = False) -> None:
        self.calls.append(RESET if reset else delta)


def utf16(text: str) -> str:
    """``text`` with each character outside the BMP as its two halves (as JSON deltas
    that cut a ``\\ud83d\\ude00`` in two leave it)."""
    return "".join(c if ord(c) <= 0xFFFF else _halves(ord(c) - 0x10000) for c in text)


def _halves(offset: int) -> str:
    return chr(0xD800 + (offset >> 10)) + chr(0xDC00 + (offset & 0x3FF))


def decided(blocks: list[str]) -> str:
    """How the adapter builds ``Decision.text`` from the whole reply's text blocks."""
    return "\n\n".join(paired(b).strip() for b in blocks if paired(b).strip())


def cut(text: str, at: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(a % (len(text) + 1) for a in at)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


async def relay(blocks: list[list[str]]) -> list[str]:
    sink = Sink()
    r = AnswerRelay(sink)
    for deltas in blocks:
        await r.block_started("text")
        for d in deltas:
            await r.text(d)
        await r.block_stopped()
    return sink.calls


TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(
            [" ", "\n", "\t", "\r", "\u2028", "\u00a0", '"', "\\", "😀", "🏽", "é", "\u0301"]
        ),
        st.characters(codec="utf-8"),
    ),
    max_size=40,
)


@given(st.lists(st.tuples(TEXT, st.lists(st.integers(0, 80), max_size=12)), max_size=4))
def test_any_cut_of_any_blocks_joins_to_the_decision_text(spec):
    blocks = [utf16(text) for text, _ in spec]
    calls = asyncio.run(relay([cut(b, at) for b, (_, at) in zip(blocks, spec, strict=True)]))
    assert RESET not in calls
    assert "".join(calls) == decided(blocks)
    assert all(not any(0xD800 <= ord(c) < 0xE000 for c in d) for d in calls)
    assert all(calls)  # never an empty delta


def test_a_tool_block_voids_what_was_sent_and_mutes_the_rest():
    async def go() -> list[str]:
        sink = Sink()
        r = AnswerRelay(sink)
        await r.block_started("text")
        await r.text("Let me check. ")
        await r.block_stopped()
        await r.block_started("tool_use")
        await r.block_stopped()
        await r.block_started("text")
        await r.text("more")
        await r.void()  # nothing more was sent: no second reset
        return sink.calls

    assert asyncio.run(go()) == ["Let me check.", RESET]


def test_a_void_before_any_text_sends_nothing():
    async def go() -> list[str]:
        sink = Sink()
        r = AnswerRelay(sink)
        await r.block_started("text")
        await r.text("   ")
        await r.void()
        return sink.calls

    assert asyncio.run(go()) == []


def test_paired_joins_halves_and_keeps_lone_ones():
    assert paired("\ud83d\ude00") == "😀"
    assert paired("a\ud83d") == "a\ud83d"
    assert paired("\ude00b") == "\ude00b"
    assert paired("plain é") == "plain é"
