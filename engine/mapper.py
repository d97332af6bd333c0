"""Converts domain events to table rows and back (a row is not an event)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.errors import InvalidEvent
from engine.events import EVENT_ADAPTER, AnyEvent, Event

ENVELOPE = ("thread_id", "seq", "event_id", "type", "created_at", "actor", "dedupe_key")
_ENVELOPE_SET = frozenset(ENVELOPE)


def to_row(event: Event) -> dict[str, Any]:
    return {
        "thread_id": event.thread_id,
        "seq": event.seq,
        "event_id": event.event_id,
        "type": event.type,
        "actor": event.actor,
        "created_at": event.created_at,
        "dedupe_key": event.dedupe_key,
        # One serialiser call (the hot path): the payload is the event minus its envelope.
        "payload": event.model_dump_json(exclude=set(_ENVELOPE_SET)),
    }


def from_row(row: Mapping[str, Any]) -> AnyEvent:
    """The typed event of a stored row (a driver's record, read by column name); a row
    that no longer parses is reported, not guessed."""
    try:
        data = json.loads(row["payload"])
        if not isinstance(data, dict):
            raise ValueError("payload is not an object")
        data.update({name: row[name] for name in ENVELOPE})
        return EVENT_ADAPTER.validate_python(data)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        first = str(exc).strip().splitlines()
        detail = " ".join(first[:3]) if first else type(exc).__name__
        raise InvalidEvent(
            f"stored event of thread {row['thread_id']} at seq {row['seq']} "
            f"({row['type']!r}) does not parse: {detail}"
        ) from exc
