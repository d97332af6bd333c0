"""The store's value types, free of any database library, so pure modules can name them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine.events import AnyEvent
from engine.state import ThreadState


@dataclass(frozen=True)
class ThreadKey:
    """Where a thread lives in Slack (or another front door): unique per thread."""

    team: str
    channel: str
    root_ts: str


@dataclass(frozen=True)
class ThreadInfo:
    """A thread's row: its key and the columns derived from its log."""

    id: str
    team: str
    channel: str
    root_ts: str
    requester: str | None
    status: str
    last_seq: int
    wake_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Decided:
    """One decision a person made on a call (``Store.decisions_by``): the event (an
    ``approval_granted`` vote, an ``approval_rejected`` or a ``reconcile_decided``), the
    thread it was made in, and the tool of the call it decided (None: not found)."""

    event: AnyEvent
    thread: ThreadKey
    tool: str | None


@dataclass(frozen=True)
class Appended:
    """What an append stored. ``deduplicated``: the input was there already."""

    events: list[AnyEvent]
    state: ThreadState | None
    deduplicated: bool = False
