"""Retrying a write that met a ``ConcurrencyConflict``: re-read, then write again.

A conflict means someone else appended first (a click, a reply, a cancel), so the
writer catches up with the log and decides again. One helper and one bound serve
every writer; the last conflict propagates (someone appends without pause: a storm or
a bug, not something to spin on).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from engine.errors import ConcurrencyConflict

T = TypeVar("T")

ATTEMPTS = 50


async def retrying(
    op: Callable[[], Awaitable[T]],
    *,
    reread: Callable[[], Awaitable[object]] | None = None,
    attempts: int = ATTEMPTS,
) -> T:
    """``await op()`` until it meets no conflict, at most ``attempts`` times, calling
    ``reread()`` after each conflict (``op`` may also read for itself)."""
    for _ in range(attempts - 1):
        try:
            return await op()
        except ConcurrencyConflict:
            if reread is not None:
                await reread()
    return await op()
