"""Converts domain events to table rows and back (a row is not an event).

Each row records the version of its type's payload schema (``schema_version``). When a
type's payload changes shape, the release that changes it registers an upcaster here,
``UPCASTERS[(type, old_version)] = fn``, taking the stored payload of ``old_version``
to the next version's shape. Reading applies the chain up to the type's current
version; the stored row is never rewritten, so the log stays what was written. A row of
a version newer than this release knows is reported, not guessed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from engine.errors import InvalidEvent
from engine.events import EVENT_ADAPTER, AnyEvent, Event

ENVELOPE = ("thread_id", "seq", "event_id", "type", "created_at", "actor", "dedupe_key")
_ENVELOPE_SET = frozenset(ENVELOPE)

Payload = dict[str, Any]
# (type, version) -> the payload at version + 1. Empty while every type is at 1.
UPCASTERS: dict[tuple[str, int], Callable[[Payload], Payload]] = {}


def current_version(event_type: str) -> int:
    """The version this release writes ``event_type`` with: one past its last upcaster."""
    version = 1
    while (event_type, version) in UPCASTERS:
        version += 1
    return version


def upcast(event_type: str, version: int, payload: Payload) -> Payload:
    """``payload`` stored at ``version``, brought to the type's current version."""
    while (step := UPCASTERS.get((event_type, version))) is not None:
        payload = step(payload)
        version += 1
    if version != current_version(event_type):
        raise ValueError(
            f"schema version {version} is newer than this release knows "
            f"({current_version(event_type)})"
        )
    return payload


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
        "schema_version": current_version(event.type),
    }


def from_row(row: Mapping[str, Any]) -> AnyEvent:
    """The typed event of a stored row (a driver's record, read by column name),
    upcast to this release's version of its type; a row that no longer parses is
    reported, not guessed."""
    try:
        data = json.loads(row["payload"])
        if not isinstance(data, dict):
            raise ValueError("payload is not an object")
        data = upcast(row["type"], row["schema_version"] or 1, data)
        data.update({name: row[name] for name in ENVELOPE})
        return EVENT_ADAPTER.validate_python(data)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        first = str(exc).strip().splitlines()
        detail = " ".join(first[:3]) if first else type(exc).__name__
        raise InvalidEvent(
            f"stored event of thread {row['thread_id']} at seq {row['seq']} "
            f"({row['type']!r}) does not parse: {detail}"
        ) from exc
