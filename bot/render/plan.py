"""The thread as a live plan: each run (:mod:`bot.render.runs`) as one plan message.

While a run goes on, its plan is streamed (``chat.startStream`` / ``appendStream`` /
``stopStream``) as chunks: a ``plan_update`` with the run's title, then one
``task_update`` per tool call (:mod:`bot.render.tasks`), then the answer as
``markdown_text``. When a stream cannot be used as is (Slack closed it, or refuses
streams in the channel), the same plan is Block Kit: a ``plan`` block of ``task_card``
blocks and a ``markdown`` block. The stopped message ends with 👍 / 👎 buttons.

The JSON is what slack_sdk's models (``PlanUpdateChunk``, ``TaskUpdateChunk``,
``PlanBlock``, ``TaskCardBlock``, ``ContextActionsBlock``, ``FeedbackButtonsElement``)
send; the tests check it against them, since renderers import no Slack library.

Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from bot import mrkdwn as md
from bot.limits import MAX_ID, Block
from bot.render.markdown import MAX_MARKDOWN, safe_markdown
from bot.render.runs import Run, request_words, runs
from bot.render.tasks import MAX_TITLE, Task, neutral, tasks_of
from engine import events as ev
from engine.chat_markup import unescape

__all__ = [
    "FEEDBACK_ACTION",
    "MAX_PLAN_TASKS",
    "Run",
    "answer_text",
    "bare",
    "chunk_key",
    "chunks_since",
    "feedback_blocks",
    "note_shown",
    "parse_feedback_block",
    "plan_blocks",
    "plan_chunks",
    "plan_text",
    "request_words",
    "runs",
]

FEEDBACK_ACTION = "opsloop_feedback"
FEEDBACK_UP, FEEDBACK_DOWN = "up", "down"
# Task cards one plan shows (the latest); with its answer and feedback row a message
# stays well within Slack's 50 blocks.
MAX_PLAN_TASKS = 40
NOTIFICATION_CHARS = 300

_MENTION = re.compile(r"<@([UW][A-Z0-9]+)>")


# --- streamed -------------------------------------------------------------------------


def plan_chunks(run: Run, *, done: bool, max_attempts: int | None = None) -> list[dict[str, Any]]:
    """The run's plan as stream chunks: a ``plan_update`` (its title), then one
    ``task_update`` per tool call (the latest ``MAX_PLAN_TASKS``). ``done``: the plan is
    final (calls a cancellation, a failure or a stop left unfinished say so).
    ``max_attempts``: a call's attempts, for "attempt 2 of 5"."""
    tasks = tasks_of(run, done=done, max_attempts=max_attempts)[-MAX_PLAN_TASKS:]
    return [{"type": "plan_update", "title": run.title}, *(_task_chunk(t) for t in tasks)]


def _task_chunk(task: Task) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "type": "task_update",
        "id": task.id,
        "title": task.title,
        "status": task.status,
    }
    if task.details:
        chunk["details"] = task.details
    if task.output:
        chunk["output"] = task.output
    if task.sources:
        chunk["sources"] = _sources(task)
    return chunk


def _sources(task: Task) -> list[dict[str, str]]:
    return [{"type": "url", "url": s.url, "text": s.text} for s in task.sources]


Shown = dict[str, dict[str, Any]]  # what a stream shows: each card by task id, the title at ""
ONCE = ("details", "output", "sources")  # a card's fields sent once (Slack may append them)
_BARE = ("type", "id", "title", "status")


def chunk_key(chunk: Mapping[str, Any]) -> str:
    """Where ``chunk`` lands in a stream's :data:`Shown`: its task id, or "" for the
    plan's title."""
    return str(chunk.get("id", "")) if chunk.get("type") == "task_update" else ""


def chunks_since(shown: Mapping[str, Mapping[str, Any]], now: Sequence[Mapping[str, Any]]) -> list:
    """The chunks that take a stream showing ``shown`` to showing ``now`` (from
    :func:`plan_chunks`). Slack replaces a card's title and status, but what it does
    with ``details`` or ``output`` named again is not clear (some report it appends
    them), so each of those (and ``sources``) is sent once, the first time the card has
    it, never again; a card whose title and status did not change and that has nothing
    new to say is not sent at all."""
    out: list[dict[str, Any]] = []
    for chunk in now:
        kind = chunk.get("type")
        old = shown.get(chunk_key(chunk))
        if kind == "plan_update":
            if old is None or old.get("title") != chunk.get("title"):
                out.append(dict(chunk))
        elif kind == "task_update":
            if old is None:
                out.append(dict(chunk))
                continue
            delta = {k: chunk[k] for k in _BARE}
            delta |= {k: chunk[k] for k in ONCE if chunk.get(k) and not old.get(k)}
            if len(delta) > len(_BARE) or any(old.get(k) != delta[k] for k in _BARE):
                out.append(delta)
    return out


def note_shown(shown: Shown, chunks: Sequence[Mapping[str, Any]]) -> None:
    """``shown`` once ``chunks`` were sent: what a chunk names replaces what was there."""
    for chunk in chunks:
        if chunk.get("type") in ("plan_update", "task_update"):
            shown.setdefault(chunk_key(chunk), {}).update(chunk)


def bare(chunks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``chunks`` without what is sent once: for a stream whose cards may show it all
    already (a restart: what was sent is not known)."""
    return [{k: v for k, v in c.items() if k not in ONCE} for c in chunks]


def answer_text(run: Run, *, limit: int = MAX_MARKDOWN) -> str:
    """What the run says at its end, as Slack markdown: the final answer, the question
    (pinging the requester), the error, the cancellation, and who stopped it. "" while
    the run is open, or when it ended on a card or a wait (the card says it). The
    model's text is escaped (:mod:`bot.render.markdown`) and cut within ``limit`` with a
    pointer to ``opsloop trace``."""
    if not run.ended:
        return ""
    head, body, tail = _said(run)
    stopper = run.stopped_by
    if stopper is not None:
        gap = "\n\n" if head or body.strip() or tail else ""
        tail += f"{gap}⏹️ Stopped by {md.mention(stopper)}."
    if not (head or body or tail):
        return ""
    return safe_markdown(body, run.thread_id, limit, head=head, tail=tail)


def _said(run: Run) -> tuple[str, str, str]:
    """(our words before, the model's or a person's text, our words after)."""
    for e in run.events:
        if isinstance(e, ev.FinalAnswer):
            return "", e.text, ""
        if isinstance(e, ev.ClarificationRequested):
            ping = f"{md.mention(run.requester)} " if run.requester else ""
            return f"❓ {ping}", e.question, ""
        if isinstance(e, ev.ErrorRaised):
            kind = md.one_line(e.kind)[:100].replace("*", "∗")
            trace = f"`opsloop trace {md.one_line(run.thread_id).replace('`', 'ˋ')}`"
            return (
                f"⚠️ **{neutral(md.escape(kind))}**: ",
                e.message,
                f"\n\nThis thread needs a human. Details: {trace}",
            )
        if isinstance(e, ev.ThreadCancelled):
            why = ": " if e.reason.strip() else ""
            return f"🚫 Cancelled by {md.mention(e.actor)}{why}", e.reason, ""
    return "", "", ""


# --- Block Kit ---------------------------------------------------------------------------


def plan_blocks(
    run: Run, *, done: bool | None = None, max_attempts: int | None = None
) -> list[Block]:
    """The whole plan as Block Kit (a ``plan`` block of ``task_card`` blocks, then the
    answer as a ``markdown`` block): for updating a stopped stream's message in place,
    and where streams are refused. ``done``: as for :func:`plan_chunks` (by default,
    whether the run ended)."""
    final = run.ended if done is None else done
    tasks = tasks_of(run, done=final, max_attempts=max_attempts)
    title = run.title
    if len(tasks) > MAX_PLAN_TASKS:
        more = f" (the latest {MAX_PLAN_TASKS} of {len(tasks)} steps)"
        title = md.truncate(title, MAX_TITLE - len(more)) + more
        tasks = tasks[-MAX_PLAN_TASKS:]
    plan: Block = {"type": "plan", "title": title}
    if tasks:
        plan["tasks"] = [_task_card(t) for t in tasks]
    blocks = [plan]
    answer = answer_text(run)
    if answer:
        blocks.append({"type": "markdown", "text": answer})
    return blocks


def _task_card(task: Task) -> Block:
    card: Block = {"type": "task_card", "task_id": task.id, "title": task.title}
    if task.details:
        card["details"] = rich_text(task.details)
    if task.output:
        card["output"] = rich_text(task.output)
    if task.sources:
        card["sources"] = _sources(task)
    card["status"] = task.status
    return card


def rich_text(escaped: str) -> Block:
    """A task's escaped text as one ``rich_text`` section: its text literally (rich
    text forms no token from text), our mentions as ``user`` elements."""
    elements: list[dict[str, Any]] = []
    at = 0
    for m in _MENTION.finditer(escaped):
        if m.start() > at:
            elements.append({"type": "text", "text": unescape(escaped[at : m.start()])})
        elements.append({"type": "user", "user_id": m.group(1)})
        at = m.end()
    if at < len(escaped):
        elements.append({"type": "text", "text": unescape(escaped[at:])})
    return {
        "type": "rich_text",
        "elements": [{"type": "rich_text_section", "elements": elements}],
    }


def plan_text(run: Run) -> str:
    """The plan message's plain ``text`` (what a notification shows): its title, and
    the start of its answer."""
    answer = md.one_line(answer_text(run, limit=NOTIFICATION_CHARS * 2))
    shown = md.truncate(answer, NOTIFICATION_CHARS)
    return f"{run.title}\n{shown}" if shown else run.title


# --- feedback ------------------------------------------------------------------------


def feedback_blocks(thread_id: str, ts: str) -> list[Block]:
    """The 👍 / 👎 row under a plan's answer: a ``context_actions`` block with one
    ``feedback_buttons`` element (``FEEDBACK_ACTION``, values "up" and "down"). Its
    block_id names the thread and the message (:func:`parse_feedback_block`)."""
    block: Block = {
        "type": "context_actions",
        "elements": [
            {
                "type": "feedback_buttons",
                "action_id": FEEDBACK_ACTION,
                "positive_button": {
                    "text": {"type": "plain_text", "text": "Good response"},
                    "accessibility_label": "This answer helped",
                    "value": FEEDBACK_UP,
                },
                "negative_button": {
                    "text": {"type": "plain_text", "text": "Bad response"},
                    "accessibility_label": "This answer did not help",
                    "value": FEEDBACK_DOWN,
                },
            }
        ],
    }
    block_id = f"{FEEDBACK_ACTION}|{thread_id}|{ts}"
    if len(block_id) <= MAX_ID and thread_id and "|" not in thread_id + ts:
        block["block_id"] = block_id
    return [block]


def parse_feedback_block(block_id: str | None) -> tuple[str, str] | None:
    """(thread_id, ts) from a feedback row's block_id, or None if it is not one."""
    parts = (block_id or "").split("|")
    if len(parts) != 3 or parts[0] != FEEDBACK_ACTION or not parts[1]:
        return None
    return parts[1], parts[2]
