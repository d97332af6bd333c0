"""The event store: threads, their append-only logs, snapshots and leases.

``Store`` is the port (``engine.store.base``); ``open_store(url)`` or ``Store.open(url)``
gives the whole backend for the URL: ``engine.store.sqlite`` or
``engine.store.postgres``. The value types live in ``engine.types`` and are re-exported
here for callers that already name them from this package.
"""

from engine.store.base import (
    BACKENDS,
    SNAPSHOT_EVERY,
    TIMED_STATUSES,
    OnRunnable,
    Store,
    WorkerInfo,
    new_thread_id,
    open_store,
)
from engine.store.postgres import PostgresStore
from engine.store.sqlite import SqliteStore
from engine.types import Appended, ThreadInfo, ThreadKey

BACKENDS.update({"postgresql": PostgresStore, "sqlite": SqliteStore})

__all__ = [
    "SNAPSHOT_EVERY",
    "TIMED_STATUSES",
    "Appended",
    "OnRunnable",
    "Store",
    "ThreadInfo",
    "ThreadKey",
    "WorkerInfo",
    "new_thread_id",
    "open_store",
]
