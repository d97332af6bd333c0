"""The task cards of a run: one per tool call, folded from the run's events.

A card's status follows its call: ``pending`` once requested (and while its approval
waits), ``in_progress`` once started, ``complete`` at a result, ``error`` at an error
result, an unknown outcome, a refusal, a rejection or an expiry.

What Slack does with a ``task_update`` that names a card's ``details`` or ``output``
again is not clear (some report that the text is appended to what the card shows), so
a card says each of them once: its details are fixed when the card first shows in a
run (the call's arguments, and what was decided about the call before the run: an
edit, the approval that let it run, a reviewer's "run it again"), its output comes
when the call ends (the result as people read it, :mod:`bot.render.readable`; its
sources, the links in that result). Whatever changes while the card shows (a wait, a
retry, "waiting for approval — see the card below") is in its title, which Slack
replaces: the call in plain words, then `` — `` and what happens to it now.

Every text here is escaped for Slack (:func:`safe`): tool names, arguments and results
can neither ping, nor link, nor break out; our own mentions are the only ``<…>`` tokens
(never in a title, which Slack shows as plain text). Lengths keep within the 256
characters Slack documents for task and plan fields.

Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from bot import limits
from bot import mrkdwn as md
from bot.render import readable
from engine import events as ev
from engine.chat_markup import unescape
from engine.config_file import rule_name
from engine.state import GRANT_PREFIX
from tools.mcp.elicitation import question_of

if TYPE_CHECKING:
    from bot.render.runs import Run

TaskStatus = Literal["pending", "in_progress", "complete", "error"]

MAX_TITLE = 256  # a plan's or a task's title (Slack documents 256 for these fields)
MAX_TASK_TEXT = 256  # a task's details, and its output
ARGUMENTS_ROOM = 160  # of the details: the rest is for what happens to the call
MAX_ERROR = 120
KEY_ARGUMENTS = 2  # shown in a task's title
KEY_VALUE = 40  # a longer value is not a key argument
MAX_TITLE_WORDS = 120  # the tool and its key arguments, before escaping
MAX_SOURCES = 8
MAX_SOURCE_TEXT = 100
MAX_WALK = 2000  # values looked at for links in one result
MAX_SCAN = 20_000  # characters of one string looked at for links

WAITING_FOR_APPROVAL = "waiting for approval — see the card below"
WAITING_FOR_ANSWER = "waiting for your answer — see the question below"
OUTCOME_UNKNOWN = "outcome unknown — see the card below"
NOTE_SEPARATOR = " — "
MAX_NOTE = 160  # of a title: the rest is for the call's words

_BROADCAST = re.compile(r"@(channel|here|everyone)\b", re.IGNORECASE)
_TASK_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_URL = re.compile(r"https?://[^\s<>\"'`|\\^{}\[\]]+")
_URL_KEYS = ("url", "href", "link", "uri", "source_url", "html_url", "web_url")
_NAME_KEYS = ("title", "name", "label", "text")


class Source(NamedTuple):
    """A link found in a result: its URL and the words shown for it (escaped)."""

    url: str
    text: str


@dataclass(frozen=True)
class Task:
    """One task card, every text escaped and within Slack's limits ("" when none)."""

    id: str
    title: str
    status: TaskStatus
    details: str = ""
    output: str = ""
    sources: tuple[Source, ...] = ()


# --- texts ------------------------------------------------------------------------------


def visible(text: object) -> str:
    """``text`` without control characters and bidirectional overrides, not escaped."""
    return unescape(md.escape(text))


def neutral(escaped: str) -> str:
    """Escaped text that no markdown reading turns into a link (``[a](b)`` needs ``]``
    right before ``(``: a zero-width space comes between) or a broadcast (``@here``)."""
    return _BROADCAST.sub("@" + md.ZWSP + r"\1", escaped.replace("]", "]" + md.ZWSP))


def safe(text: object, limit: int) -> str:
    """Untrusted ``text`` escaped and neutral, at most ``limit`` characters."""
    return md.truncate(neutral(md.escape(text)), limit)


def call_id(e: ev.Event) -> str | None:
    value = getattr(e, "tool_call_id", None)
    return value if isinstance(value, str) and value else None


def task_id(tool_call_id: str) -> str:
    """The card's id: the call's id when it is a plain short one, else a digest of it
    (the same call always has the same card)."""
    if _TASK_ID.match(tool_call_id):
        return tool_call_id
    return "task_" + hashlib.sha256(tool_call_id.encode()).hexdigest()[:32]


def call_words(intent: str, arguments: Mapping[str, Any]) -> str:
    """A call in plain words, not escaped: the tool's title and up to two short scalar
    arguments, ``Check health (service: api)``."""
    title = readable.tool_title(intent)
    keys: list[str] = []
    for key, value in arguments.items():
        if len(keys) == KEY_ARGUMENTS:
            break
        if isinstance(value, str | int | float | bool):
            shown = readable.inline(value)
            if shown and len(shown) <= KEY_VALUE:
                keys.append(f"{md.one_line(key)[:KEY_VALUE]}: {shown}")
    words = f"{title} ({', '.join(keys)})" if keys else title
    return words if len(words) <= MAX_TITLE_WORDS else words[: MAX_TITLE_WORDS - 1] + "…"


def latest_call(events: Sequence[ev.Event], tool_call_id: str) -> tuple[str, dict] | None:
    """The tool and latest arguments of call ``tool_call_id`` in ``events``."""
    found: tuple[str, dict] | None = None
    for e in events:
        if isinstance(e, ev.ToolCallRequested) and e.tool_call_id == tool_call_id:
            found = (e.intent, e.arguments)
        elif isinstance(e, ev.ApprovalEdited) and e.tool_call_id == tool_call_id and found:
            if e.policy != "reject":
                found = (found[0], e.arguments)
    return found


def people(ids: Sequence[str]) -> str:
    """ "<@A>", "<@A> and <@B>", "<@A>, <@B> and <@C>"."""
    named = [md.mention(i) for i in dict.fromkeys(ids)]
    if len(named) <= 2:
        return " and ".join(named)
    return f"{', '.join(named[:-1])} and {named[-1]}"


def after(seconds: float) -> str:
    """ "in 4 s", "in 3 min", "in 2 h"."""
    if seconds < 1:
        return "now"
    if seconds < 90:
        return f"in {round(seconds)} s"
    if seconds < 90 * 60:
        return f"in {round(seconds / 60)} min"
    return f"in {round(seconds / 3600)} h"


def titled(words: str, note: str) -> str:
    """A card's title: the call's ``words`` (escaped) and, after a dash, ``note`` (what
    happens to it now, escaped), within ``MAX_TITLE``; the words are cut first."""
    if not note:
        return md.truncate(words, MAX_TITLE)
    note = md.truncate(note, MAX_NOTE)
    room = MAX_TITLE - md.slack_len(note) - len(NOTE_SEPARATOR)
    return f"{md.truncate(words, room)}{NOTE_SEPARATOR}{note}"


def progress_note(progress: float, total: float | None, message: str | None) -> str:
    """A running call's progress as its title's note, escaped: "40 % — copying files"
    (a share of ``total`` when it is known, else the count: "step 3")."""
    if total is not None and total > 0 and progress >= 0:
        said = f"{min(100, round(100 * progress / total))} %"
    else:
        said = f"step {progress:g}"
    words = safe(md.one_line(message), MAX_ERROR) if message and message.strip() else ""
    return f"{said}{NOTE_SEPARATOR}{words}" if words else said


# --- one card ---------------------------------------------------------------------------


class Lines:
    """Text that only grows: a line added later never changes what came before (a line
    that does not fit is cut once, and nothing is added after it)."""

    def __init__(self, limit: int = MAX_TASK_TEXT) -> None:
        self.text = ""
        self.limit = limit
        self.full = False

    def add(self, escaped: str) -> None:
        if self.full or not escaped:
            return
        joined = f"{self.text}\n{escaped}" if self.text else escaped
        if md.slack_len(joined) <= self.limit:
            self.text = joined
            return
        self.full = True
        room = self.limit - md.slack_len(self.text) - (1 if self.text else 0)
        if room >= 16:  # a few words and the ellipsis, or nothing
            self.text = (f"{self.text}\n" if self.text else "") + md.truncate(escaped, room)


@dataclass
class _Card:
    call_id: str
    intent: str
    arguments: dict[str, Any]
    status: TaskStatus = "pending"
    details: Lines = field(default_factory=Lines)
    output: str = ""
    sources: tuple[Source, ...] = ()
    awaiting: bool = False  # its approval card is open
    note: str = ""  # what happens to it now, shown in its title (escaped)
    retried: bool = False  # a retry was scheduled: its attempts are counted in the title
    votes: list[str] = field(default_factory=list)
    editors: list[str] = field(default_factory=list)

    def show_arguments(self) -> None:
        text = readable.arguments_text(self.arguments)
        if text:
            self.details.add(md.truncate(neutral(md.escape(text)), ARGUMENTS_ROOM))

    def end(self, status: TaskStatus, output: str, sources: tuple[Source, ...] = ()) -> None:
        """``output`` is escaped already (it may name people)."""
        self.status, self.awaiting, self.note = status, False, ""
        self.output = md.truncate(output, MAX_TASK_TEXT)
        self.sources = sources

    def task(self) -> Task:
        return Task(
            id=task_id(self.call_id),
            title=titled(safe(call_words(self.intent, self.arguments), MAX_TITLE), self.note),
            status=self.status,
            details=self.details.text,
            output=self.output,
            sources=self.sources,
        )


def tasks_of(run: Run, *, done: bool = False, max_attempts: int | None = None) -> list[Task]:
    """The run's task cards, in the order its calls first appear in it. ``done``: the
    plan is final (its stream is stopped), so a call a cancellation, a failure or a stop
    left unfinished says so. ``max_attempts``: how many attempts a call gets."""
    known: dict[str, _Card] = {}
    for e in run.earlier:
        _remember(known, e)
    cards: dict[str, _Card] = {}
    for e in run.events:
        _apply(cards, known, e, max_attempts, resumed=e is run.start)
    if done:
        _finish(cards, run)
    return [card.task() for card in cards.values()]


def _remember(known: dict[str, _Card], e: ev.Event) -> None:
    """A call requested before the run: its latest arguments and the votes so far."""
    if isinstance(e, ev.ToolCallRequested):
        known[e.tool_call_id] = _Card(e.tool_call_id, e.intent, e.arguments)
    card = known.get(call_id(e) or "")
    if card is None:
        return
    if isinstance(e, ev.ApprovalEdited) and e.policy != "reject":
        card.arguments, card.votes = e.arguments, []
        card.editors.append(e.reviewer)
    elif isinstance(e, ev.ApprovalGranted):
        card.votes.append(e.actor)


def _card_for(cards: dict[str, _Card], known: dict[str, _Card], e: ev.Event) -> _Card | None:
    cid = call_id(e)
    if cid is None:
        return None
    if isinstance(e, ev.ToolCallRequested):
        card = _Card(e.tool_call_id, e.intent, e.arguments)
        card.show_arguments()
        cards[cid] = card
        return card
    if cid not in cards and cid in known:  # a call this run continues
        card = cards[cid] = known.pop(cid)
        card.show_arguments()
        if card.editors:
            card.details.add(f"arguments edited by {people(card.editors)}")
    return cards.get(cid)


def _apply(
    cards: dict[str, _Card],
    known: dict[str, _Card],
    e: ev.Event,
    max_attempts: int | None,
    *,
    resumed: bool,
) -> None:
    """What ``e`` does to its call's card (``resumed``: ``e`` started the run)."""
    card = _card_for(cards, known, e)
    if card is None:
        return
    if isinstance(e, ev.ToolCallRequested):
        if e.policy == "reject":
            rule = f" by {rule_name(e.rule)}" if e.rule is not None else ""
            why = f": {safe(md.one_line(e.reason), MAX_ERROR)}" if e.reason.strip() else ""
            card.end("error", f"refused{rule}{why}")
    elif isinstance(e, ev.ApprovalRequested):
        card.status, card.awaiting, card.note = "pending", True, WAITING_FOR_APPROVAL
    elif isinstance(e, ev.ApprovalGranted):
        _approved(card, e, resumed)
    elif isinstance(e, ev.ApprovalEdited):
        _edited(card, e)
    elif isinstance(e, ev.ApprovalRejected):
        why = f": {safe(md.one_line(e.reason), MAX_ERROR)}" if e.reason.strip() else ""
        card.end("error", f"rejected by {md.mention(e.actor)}{why}")
    elif isinstance(e, ev.ApprovalExpired):
        card.end("error", "nobody approved it in time")
    elif isinstance(e, ev.ApprovalWithdrawn):
        card.end("error", f"withdrawn: {md.mention(e.actor)} wrote again")
    else:
        _ran(card, e, max_attempts)


def _approved(card: _Card, e: ev.ApprovalGranted, resumed: bool) -> None:
    """A vote: the one that let the call run started the run (a quorum's last, or a
    standing grant's, which lets it run at once); others only count."""
    card.votes.append(e.actor)
    if e.actor.startswith(GRANT_PREFIX):
        who = f"{md.mention(e.grant.reviewer)}'s" if e.grant is not None else "a"
        card.details.add(f"approved by {who} standing grant")
    elif resumed:
        card.details.add(f"approved by {people(card.votes)}")
    else:
        return
    card.status, card.awaiting, card.note = "pending", False, ""


def _edited(card: _Card, e: ev.ApprovalEdited) -> None:
    if e.policy == "reject":
        why = f": {safe(md.one_line(e.reason), MAX_ERROR)}" if e.reason.strip() else ""
        card.end("error", f"the edited arguments were refused{why}")
        return
    card.arguments, card.votes = e.arguments, []
    card.details.add(f"arguments edited by {md.mention(e.reviewer)}")


def _ran(card: _Card, e: ev.Event, max_attempts: int | None) -> None:
    """What running the call did to its card."""
    of = f" of {max_attempts}" if max_attempts else ""
    if isinstance(e, ev.ToolStarted):
        card.status = "in_progress"
        card.note = f"attempt {e.attempt}{of}" if card.retried and e.attempt > 1 else ""
    elif isinstance(e, ev.RetryScheduled):
        card.status, card.retried = "in_progress", True
        card.note = _retry_line(e, max_attempts)
    elif isinstance(e, ev.ToolResult):
        if e.ok:
            card.end("complete", _readable(e.output), sources_of(e.output))
        else:
            card.end("error", safe(md.one_line(e.error or "failed"), MAX_TASK_TEXT))
    elif isinstance(e, ev.ToolOutcomeUnknown):
        card.end("error", OUTCOME_UNKNOWN)
    elif isinstance(e, ev.ReconcileDecided):
        note = f": {safe(md.one_line(e.note), MAX_ERROR)}" if e.note.strip() else ""
        if e.decision == "happened":
            card.end("complete", f"it happened, says {md.mention(e.reviewer)}{note}")
        elif e.decision == "abandon":
            card.end("error", f"it did not happen, says {md.mention(e.reviewer)}{note}")
        else:  # the run starts here: the card shows first with it
            card.status = "pending"
            card.details.add(f"{md.mention(e.reviewer)} said to run it again")
    elif isinstance(e, ev.WaitStarted):
        card.status = "in_progress"
        if question_of(e.data) is not None:  # asked in a message of its own, with buttons
            card.note = WAITING_FOR_ANSWER
        else:
            card.note = f"waiting for {safe(md.one_line(e.description), MAX_ERROR)}"
    elif isinstance(e, ev.WaitFinished | ev.WaitTimedOut) and e.resumes:
        card.status = "pending"  # the call goes on: its next attempt has the answer
        timed_out = isinstance(e, ev.WaitTimedOut)
        card.note = "the wait timed out" if timed_out else "the wait is over"
    elif isinstance(e, ev.WaitFinished):
        card.end("complete", _readable(e.result), sources_of(e.result))
    elif isinstance(e, ev.WaitTimedOut):
        card.end("error", "gave up waiting: it timed out")


def _retry_line(e: ev.RetryScheduled, max_attempts: int | None) -> str:
    """ "attempt 1 failed: timeout; attempt 2 of 5 in 4 s"."""
    of = f" of {max_attempts}" if max_attempts else ""
    when = after(_seconds(e.wake_at, e.created_at))
    error = safe(md.one_line(e.error), 60)
    return f"attempt {e.attempt} failed: {error}; attempt {e.attempt + 1}{of} {when}"


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def _readable(value: Any) -> str:
    return safe(readable.result_text(value), MAX_TASK_TEXT)


def _finish(cards: dict[str, _Card], run: Run) -> None:
    """A final plan: calls a cancellation, a failure or a stop left unfinished say so."""
    stop = run.stop
    if isinstance(stop, ev.ThreadCancelled):
        why = f"cancelled by {md.mention(stop.actor)}"
    elif isinstance(stop, ev.ErrorRaised):
        why = "the thread failed"
    elif run.stopped_by is not None and stop is not None:
        why = f"stopped by {md.mention(run.stopped_by)}"
    else:
        return
    for card in cards.values():
        if card.status == "in_progress":
            card.end("error", card.output or f"unfinished: {why}")
        elif card.status == "pending" and not card.awaiting:
            card.end("error", card.output or f"not run: {why}")


# --- sources ----------------------------------------------------------------------------


def sources_of(value: Any, limit: int = MAX_SOURCES) -> tuple[Source, ...]:
    """The links in a result, once each, at most ``limit``: an MCP result's resource
    links, an object's ``url`` (named by its ``title`` or ``name``), URLs in its text."""
    found: dict[str, str] = {}
    inner, attachments = readable.content(value)
    for a in attachments:
        _add(found, a.get("uri"), a.get("name") or a.get("title"))
    for url, name in _links(inner):
        if len(found) >= limit:
            break
        _add(found, url, name)
    return tuple(Source(u, t) for u, t in list(found.items())[:limit])


def _links(value: Any) -> Iterator[tuple[str, Any]]:
    """(url, its name or None) in ``value``, depth first, within ``MAX_WALK`` values."""
    stack: list[Any] = [value]
    seen = 0
    while stack and seen < MAX_WALK:
        node = stack.pop()
        seen += 1
        if isinstance(node, str):
            for m in _URL.finditer(node[:MAX_SCAN]):
                yield m.group(0), None
        elif isinstance(node, Mapping):
            name = next((node[k] for k in _NAME_KEYS if isinstance(node.get(k), str)), None)
            for key in _URL_KEYS:
                if isinstance(node.get(key), str):
                    yield node[key], name
            stack.extend(reversed([v for k, v in node.items() if k not in _URL_KEYS]))
        elif isinstance(node, list | tuple):
            stack.extend(reversed(node))


def _add(found: dict[str, str], url: Any, name: Any) -> None:
    if not isinstance(url, str):
        return
    url = url.strip().rstrip(".,;:!?)")
    if not _URL.fullmatch(url) or len(url) > limits.MAX_URL or url in found:
        return
    words = md.one_line(name) if isinstance(name, str) and name.strip() else _short(url)
    found[url] = safe(words, MAX_SOURCE_TEXT)


def _short(url: str) -> str:
    """ "docs.example.com/runbooks/api" for a link without a name."""
    bare = url.split("://", 1)[1].split("?", 1)[0].split("#", 1)[0].rstrip("/")
    return bare if len(bare) <= 60 else bare[:59] + "…"
