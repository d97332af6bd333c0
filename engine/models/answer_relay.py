"""A streamed reply's text, relayed to a ``TextSink`` exactly as the decision will hold it.

The Anthropic adapter builds ``Decision.text`` from the whole reply: each text block
stripped, empty ones dropped, the rest joined with a blank line. The relay forwards the
text deltas as they arrive under the same rules, so the pieces it sends always join to a
prefix of that text, and to all of it once the reply has ended:

- a block's leading whitespace is dropped; its trailing whitespace is held back until
  more text follows it in the same block (so the block's end drops it);
- the blank line between two blocks is sent with the second block's first character;
- a high surrogate at the end of a delta waits for the next piece, and pairs are joined
  into one character (``paired``), so a sink never sees half a character.

Which reply is a final answer is known only at its end (Claude writes any words before
a tool call first, in a text block, and the API has no field that says "this text is an
answer"): the relay sends the text at once, and ``void`` resets the sink when the reply
turns out to be something else. Waiting for the end instead would make streaming moot.
"""

from __future__ import annotations

from engine.models.base import TextSink

_HIGH_SURROGATES = range(0xD800, 0xDC00)


def paired(text: str) -> str:
    """``text`` with each surrogate pair (two code units, as JSON's ``\\ud83d\\ude00``
    written in two deltas leaves them) joined into the one character it encodes; a lone
    surrogate stays as it is."""
    if not any(0xD800 <= ord(c) < 0xE000 for c in text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


class AnswerRelay:
    """Feed it a streamed reply's blocks and text deltas; it calls ``sink`` with the
    answer's text as it grows, and with ``reset=True`` on ``void``."""

    def __init__(self, sink: TextSink) -> None:
        self.sink = sink
        self.sent = False  # text went to the sink since its last reset
        self.muted = False  # the reply is not an answer: nothing more is sent
        self._blocks = 0  # text blocks that had text so far
        self._in_text = False  # a text block is open and has had text
        self._held = ""  # the open block's trailing whitespace
        self._carry = ""  # a high surrogate waiting for its pair

    async def block_started(self, kind: str) -> None:
        """A content block begins; anything but text (a tool call) ends the answer."""
        await self._close_block()
        if kind != "text":
            await self.void()
            self.muted = True

    async def text(self, delta: str) -> None:
        if self.muted or not delta:
            return
        if not self._in_text:
            delta = delta.lstrip()
            if not delta:
                return
            lead = "\n\n" if self._blocks else ""
            self._blocks += 1
            self._in_text = True
        else:
            lead = self._held
        body = delta.rstrip()
        if not body:
            self._held += delta
            return
        self._held = delta[len(body) :]
        await self._send(lead + body)

    async def block_stopped(self) -> None:
        await self._close_block()

    async def void(self) -> None:
        """What was sent is not an answer (or the request failed): reset the sink."""
        self._held, self._carry = "", ""
        if self.sent:
            self.sent = False
            await self.sink("", reset=True)

    async def _close_block(self) -> None:
        self._held = ""
        self._in_text = False
        if self._carry and not self.muted:
            # A lone high surrogate ends the block: it is in the decision's text too.
            carry, self._carry = self._carry, ""
            await self._emit(carry)

    async def _send(self, piece: str) -> None:
        piece = self._carry + piece
        self._carry = ""
        if ord(piece[-1]) in _HIGH_SURROGATES:
            piece, self._carry = piece[:-1], piece[-1]
        if piece:
            await self._emit(paired(piece))

    async def _emit(self, piece: str) -> None:
        self.sent = True
        await self.sink(piece)
