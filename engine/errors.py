"""Errors the engine raises on purpose, rooted at ``EngineError``.

A model call's failure is the other tree: ``engine.models.base.ModelError`` (retryable
or not) belongs to the model port, which the runner turns into events; it is not an
``EngineError`` because it describes the model service, not the engine.

EngineError
├── InvalidEvent          an event (new, or read back from the store) fails its schema
├── IllegalTransition     the reducer refuses an event in the current state
├── ConcurrencyConflict   another writer appended first (expected_seq is stale)
├── ThreadNotFound        no thread with that id or Slack key
├── ConfigError           bad settings (DATABASE_URL, tool modules…); one-line message
└── StoreUnavailable      the database cannot be reached
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidEvent(EngineError):
    pass


class IllegalTransition(EngineError):
    def __init__(self, event_type: str, status: str, why: str) -> None:
        self.event_type = event_type
        self.status = status
        self.why = why
        super().__init__(f"illegal {event_type!r} in state {status!r}: {why}")


class ConcurrencyConflict(EngineError):
    def __init__(self, thread_id: str, expected_seq: int) -> None:
        self.thread_id = thread_id
        self.expected_seq = expected_seq
        super().__init__(f"thread {thread_id} moved past seq {expected_seq}")


class ThreadNotFound(EngineError):
    pass


class ConfigError(EngineError):
    pass


class StoreUnavailable(EngineError):
    pass
