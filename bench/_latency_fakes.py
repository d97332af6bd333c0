"""The fakes' side of ``bench/latency.py``: Slack and Anthropic in a process of their own,
stamping what arrives, and the bench's side that reads the stamps.

The fake Slack stamps (``time.time()`` as a call arrives) every call that shows
something in a thread: ``chat.postMessage`` (``post``), ``chat.update`` (``update``, or
``replace`` for a plan message replaced whole), ``chat.startStream`` / ``appendStream``
/ ``stopStream`` (``start``, ``append``, ``stop``: with the stream's markdown text so
far, and the answer text the call itself carried) and ``assistant.threads.setStatus``
(``status``, with its words). The fake Anthropic stamps each request as it arrives
(``model``) and, for a streamed reply, the moment it writes the first text delta
(``token``), both with the thread's tag and stage. :class:`Stamps` collects them in the
bench's process.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import multiprocessing
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bot.render.approval import APPROVE_ACTION
from tests.fakes.anthropic import FakeAnthropic, Reply
from tests.fakes.slack import FakeSlack

REQUESTER = "U0BENCHREQ"
QUESTION = "Which region?"
# The flows' final answer, streamed. Its first text delta (the fake cuts deltas of three
# characters) holds a whole word, as a model's first token does: a front door that
# shows only whole words can show it at once. Short: each event waits STREAM_GAP_S.
ANSWER = "I did."
CI_REPO = "acme/api"
# A held model call answers after this long: the bench kills its process well before,
# and a thread the other replica happened to take finishes on its own.
HOLD_S = 15.0
# Between two events of the streamed final answer: its first text delta stands apart
# from the request before it and from the next delta, so the first character in Slack
# can only have come from the first token.
STREAM_GAP_S = 0.2
TAG = re.compile(r"tag=([a-z0-9]+)")
SHOWN = {
    "chat.postMessage": "post",
    "chat.update": "update",
    "chat.startStream": "start",
    "chat.appendStream": "append",
    "chat.stopStream": "stop",
    "assistant.threads.setStatus": "status",
}
# What a person reads in the thread: posts, and plan messages as streamed so far.
SHOWS = ("post", "start", "append", "stop", "replace")

_arrived: contextvars.ContextVar[float] = contextvars.ContextVar("arrived", default=0.0)
# The tag and stage of the request a handler answers (each aiohttp handler is a task).
_asked: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("asked", default=("?", -1))


class Sink(Protocol):
    """Where stamps go: the queue to the bench's process (a list in tests)."""

    def put(self, item: Any, /) -> None: ...


class StampedAnthropic(FakeAnthropic):
    """Stamps each request when it arrives (each aiohttp handler is a task of its own,
    so the stamp travels to the responder in a context variable)."""

    async def _messages(self, request: Any) -> Any:
        _arrived.set(time.time())
        return await super()._messages(request)


class FirstTokens(list[float]):
    """``FakeAnthropic.text_started``: each streamed reply's first text delta, as it is
    written; each also goes to ``records`` with the tag and stage of its request."""

    def __init__(self, records: Sink) -> None:
        super().__init__()
        self.records = records

    def append(self, t: float) -> None:
        super().append(t)
        tag, stage = _asked.get()
        self.records.put({"kind": "token", "t": t, "tag": tag, "stage": stage})


def model_reply(tag: str, stage: int, nth: int) -> Reply:
    """The zero-latency model's script, by the thread's tag and how many tools it used.

    A kill thread (tag ``k…``) is held ``HOLD_S`` in its first model call: its process is
    killed before then, or (the replica not killed) it is answered "held". The hold stays
    under the model timeout, or that replica times out and asks again, answered "Resumed".
    A flow's final answer is streamed ``STREAM_GAP_S`` between events.
    """
    if tag.startswith("k"):
        return (
            Reply.text("held", delay=HOLD_S) if nth == 1 else Reply.text("Resumed after the crash.")
        )
    if tag.startswith("a"):  # an alert's thread: the model summarises at once
        return Reply.text(f"Looked at the alert, tag {tag}.")
    if tag.startswith(("g", "h")):  # a CI thread: dispatch, then report the run
        if stage == 0:
            inputs = {"environment": tag}
            call = {"repo": CI_REPO, "workflow": "deploy.yml", "ref": "main", "inputs": inputs}
            return Reply.tool_use("github_dispatch_workflow", call, text="Dispatching.")
        return Reply.text(f"The run finished, tag {tag}.")
    if stage >= 3:
        answer = Reply.text(ANSWER)
        answer.gap = STREAM_GAP_S
        return answer
    script = [
        Reply.tool_use("bench_deploy", {"tag": tag}, text="Deploying."),
        Reply.tool_use("request_clarification", {"question": QUESTION}),
        Reply.tool_use("bench_wait", {"tag": tag}),
    ]
    return script[stage]


def approve_value(blocks: Any) -> str | None:
    for block in blocks if isinstance(blocks, list) else []:
        for element in block.get("elements", []) if block.get("type") == "actions" else []:
            if element.get("action_id") == APPROVE_ACTION:
                return element.get("value")
    return None


def answer_of(params: dict[str, Any]) -> str:
    """The markdown text a stream call carries: its ``markdown_text`` and its
    ``markdown_text`` chunks (the answer; task cards are ``task_update`` chunks)."""
    chunks = params.get("chunks")
    texts = [params.get("markdown_text") or ""]
    texts += [
        c.get("text") or ""
        for c in (chunks if isinstance(chunks, list) else [])
        if isinstance(c, dict) and c.get("type") == "markdown_text"
    ]
    return "".join(t for t in texts if isinstance(t, str))


class StampedSlack(FakeSlack):
    """Stamps each call that shows something in a thread, once it succeeded."""

    def __init__(self, records: Sink) -> None:
        super().__init__()
        self.records = records

    async def serve(self, call: Any) -> Any:
        arrived = time.time()
        response = await super().serve(call)
        kind = SHOWN.get(call.method)
        if kind is not None:
            body = response.body
            answer = json.loads(body) if isinstance(body, bytes | bytearray) else {}
            if answer.get("ok"):
                self.records.put(self.stamp(kind, arrived, call.params, answer))
        return response

    def stamp(
        self, kind: str, arrived: float, params: dict[str, Any], answer: dict[str, Any]
    ) -> dict[str, Any]:
        channel = answer.get("channel") or params.get("channel") or params.get("channel_id")
        if kind == "status":
            words = params.get("status")
            text = words if isinstance(words, str) else ""
            where = {"channel": channel, "thread_ts": params.get("thread_ts")}
            return {"kind": kind, "t": arrived, **where, "text": text}
        ts = answer.get("ts") or params.get("ts")
        message = self.workspace.find(str(channel), ts) or {}
        stream = self.workspace.streams.get(f"{channel}/{ts}")
        blocks = params.get("blocks")
        stamp = {
            "t": arrived,
            "channel": channel,
            "thread_ts": params.get("thread_ts") or message.get("thread_ts"),
            "ts": ts,
            "value": approve_value(blocks),
        }
        if kind == "update" and stream is not None:
            kind = "replace"  # a plan message shown whole in place of its stream
        if stream is not None and kind != "replace":
            text = stream["text"]
            stamp["answer"] = answer_of(params)[:4000]
        else:
            text = f"{params.get('text', '')} {json.dumps(blocks)}"
        return {**stamp, "kind": kind, "text": text[-4000:]}


def responder(records: Sink) -> Callable[[dict[str, Any]], Reply]:
    """The fake Anthropic's responder: each request stamped (``model``) and answered by
    :func:`model_reply`, from the thread's tag (in its first message) and the tools it
    used so far."""
    seen: Counter[tuple[str, int]] = Counter()

    def respond(body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or [{}]
        found = TAG.search(json.dumps(messages[0])) or TAG.search(json.dumps(messages))
        tag = found.group(1) if found else "?"
        stage = sum(
            1
            for m in messages
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"]
            if b.get("type") == "tool_use"
        )
        seen[(tag, stage)] += 1
        nth = seen[(tag, stage)]
        _asked.set((tag, stage))  # for the reply's first token, in this handler's task
        records.put({"kind": "model", "t": _arrived.get(), "tag": tag, "stage": stage, "nth": nth})
        return model_reply(tag, stage, nth)

    return respond


def run_fakes(
    roots: list[tuple[str, str, str]],
    urls: multiprocessing.Queue,
    records: multiprocessing.Queue,
    stop: Any,
) -> None:
    """Slack and Anthropic, in a process of their own (their servers are elsewhere, so
    their work must not slow the processes measured); every stamp goes to ``records``."""

    async def main() -> None:
        async with StampedSlack(records) as slack, StampedAnthropic() as claude:
            claude.responder = responder(records)
            claude.text_started = FirstTokens(records)
            for channel, text, ts in roots:  # what people wrote is in the channel, as in Slack
                slack.add_message(channel, text, user=REQUESTER, ts=ts)
            urls.put((slack.url, claude.url))
            await asyncio.to_thread(stop.wait)

    asyncio.run(main())


# --- the bench's side: stamps as they come in --------------------------------------------


@dataclass(frozen=True)
class Stamp:
    kind: str  # post | update | replace | start | append | stop | status | model | token
    t: float
    channel: str | None = None
    thread_ts: str | None = None
    ts: str | None = None
    text: str = ""  # a post's text and blocks; a stream's text so far; a status's words
    answer: str = ""  # the markdown text a start or append carried
    value: str | None = None
    tag: str = ""
    stage: int = -1
    nth: int = 0


def shown_in(stamp: Stamp, root: str, text: str, after: float = 0.0) -> bool:
    """Whether ``stamp`` shows ``text`` in the thread at ``root`` (a post, or a plan
    message as streamed so far), from ``after`` on."""
    return (
        stamp.kind in SHOWS and stamp.thread_ts == root and stamp.t >= after and text in stamp.text
    )


class Stamps:
    """What the fakes saw, in arrival order; ``first(match)`` waits for a match."""

    def __init__(self, source: multiprocessing.Queue) -> None:
        self.source = source
        self.seen: list[Stamp] = []
        self.cond = asyncio.Condition()
        self.closed = False

    async def pump(self) -> None:
        while not self.closed:
            item = await asyncio.to_thread(next_record, self.source, 0.2)
            if item is not None:
                async with self.cond:
                    self.seen.append(Stamp(**item))
                    self.cond.notify_all()

    async def first(self, match: Callable[[Stamp], bool], what: str, within: float = 30) -> Stamp:
        def found() -> Stamp | None:
            return next((s for s in self.seen if match(s)), None)

        try:
            async with asyncio.timeout(within), self.cond:
                await self.cond.wait_for(lambda: found() is not None)
        except TimeoutError:
            raise RuntimeError(f"never seen within {within:.0f} s: {what}") from None
        hit = found()
        assert hit is not None
        return hit


def next_record(source: multiprocessing.Queue, timeout: float) -> Any:
    try:
        return source.get(True, timeout)
    except Exception:  # queue.Empty; nothing came in time
        return None
