"""The archive of ``opsloop archive``: ended threads moved out of the hot tables into a
JSON Lines file, and read back by ``opsloop trace --from FILE``.

One line per event: the event as ``opsloop trace --json`` prints it (``trace_record``),
plus ``thread`` (the thread's row as ``opsloop threads --json`` prints it, with its
``created_at``), ``schema_version`` (the event type's payload version, so a later
release upcasts it through ``engine.mapper``) and ``archive`` (this format's version).
Every line stands alone: ``grep``/``jq`` need no header.

Nothing is lost if the process dies anywhere (``archive_threads``): a thread's lines are
written and made durable (the caller's ``write`` flushes and fsyncs) before the thread
is deleted, in one transaction that only matches if the thread did not move meanwhile.
So a thread is either whole in the database, or in the file and gone from the
database, or (a crash between the two) in both; a re-run then writes it again.

The reading rule that makes repeats harmless: a thread may appear in several runs of
lines (a re-run after a crash, a thread reopened and archived again later, several files
concatenated). Readers take the union of its events by ``seq``: a log is append-only and
a deletion is guarded by ``last_seq``, so every copy of one seq is the same event. The
thread's row is the one of the copy with the highest ``last_seq``. A last line without
its newline is a write cut short by a crash: readers skip it, and the writer cuts it off
before appending (its thread is still in the database).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine import faults, mapper
from engine.errors import EngineError, ThreadNotFound
from engine.events import AnyEvent
from engine.store.base import Store
from engine.trace import iso, thread_record, trace_record
from engine.types import ThreadInfo

FORMAT = 1
# Keys a line adds to the trace record (no event type has a field of these names).
ADDED = ("archive", "thread", "schema_version")
PAGE = 100


class ArchiveError(EngineError):
    """An archive file that cannot be read (one line naming the file and line)."""


# --- writing ------------------------------------------------------------------------


def thread_header(info: ThreadInfo) -> dict[str, Any]:
    return {**thread_record(info), "created_at": iso(info.created_at)}


def archive_lines(info: ThreadInfo, events: Sequence[AnyEvent]) -> list[str]:
    """The lines of one thread, in seq order, without their newlines."""
    header = thread_header(info)
    return [
        json.dumps(
            {
                "archive": FORMAT,
                "thread": header,
                "schema_version": mapper.current_version(e.type),
                **trace_record(e),
            },
            ensure_ascii=False,
        )
        for e in events
    ]


@dataclass
class ArchiveRun:
    """What a run did: threads and events moved out; ``moved``: threads that changed
    between being read and being deleted (written to the file, left in the database)."""

    threads: int = 0
    events: int = 0
    moved: list[str] = field(default_factory=list)


async def archive_threads(
    store: Store,
    before: datetime,
    write: Callable[[list[str]], None],
    *,
    now: datetime | None = None,
    page: int = PAGE,
) -> ArchiveRun:
    """Move every thread that ended before ``before`` out of the hot tables, one at a
    time: read it, ``write`` its lines (which must be durable when it returns), then
    delete it in one transaction guarded by its ``last_seq``."""
    run = ArchiveRun()
    after = ""
    while True:
        infos = await store.select_ended_threads(before, after=after, limit=page, now=now)
        if not infos:
            return run
        for info in infos:
            events = await store.select_events(info.id)
            if not events or events[-1].seq != info.last_seq:
                run.moved.append(info.id)  # appended to since the page was read
                continue
            write(archive_lines(info, events))
            faults.hit("archive_written")  # crash tests: die between the file and the delete
            if await store.delete_thread(info.id, info.last_seq, before=before, now=now):
                run.threads += 1
                run.events += len(events)
            else:
                run.moved.append(info.id)
        after = infos[-1].id


# --- reading ------------------------------------------------------------------------


@dataclass
class ArchivedThread:
    """One thread read back: its row and its events in seq order."""

    info: ThreadInfo
    events: list[AnyEvent]

    @property
    def complete(self) -> bool:
        """Every seq from 1 to the row's ``last_seq`` is there."""
        return [e.seq for e in self.events] == list(range(1, self.info.last_seq + 1))


def _info(header: dict[str, Any]) -> ThreadInfo:
    return ThreadInfo(
        id=header["thread_id"],
        team=header["team"],
        channel=header["channel"],
        root_ts=header["thread_ts"],
        requester=header["requester"],
        status=header["status"],
        last_seq=int(header["last_seq"]),
        wake_at=None,
        lease_owner=None,
        lease_expires_at=None,
        created_at=datetime.fromisoformat(header["created_at"]),
        updated_at=datetime.fromisoformat(header["updated_at"]),
    )


def _event(record: dict[str, Any], thread_id: str) -> AnyEvent:
    """The typed event of a line, through the mapper (so upcasters apply)."""
    payload = {k: v for k, v in record.items() if k not in mapper.ENVELOPE and k not in ADDED}
    row = {
        "thread_id": thread_id,
        "seq": record["seq"],
        "event_id": record["event_id"],
        "type": record["type"],
        "actor": record["actor"],
        "created_at": record["created_at"],
        "dedupe_key": record.get("dedupe_key"),
        "payload": json.dumps(payload),
        "schema_version": record["schema_version"],
    }
    return mapper.from_row(row)


def read_archive(text: str, name: str = "the archive") -> dict[str, ArchivedThread]:
    """Every thread in ``text`` (an archive file's content), by id, per the reading rule."""
    lines = text.split("\n")
    lines.pop()  # what follows the last newline: nothing, or a write cut short
    headers: dict[str, dict[str, Any]] = {}
    events: dict[str, dict[int, AnyEvent]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or record.get("archive") != FORMAT:
                raise ValueError(f"not a line of an opsloop archive (format {FORMAT})")
            header = record["thread"]
            tid = header["thread_id"]
            event = _event(record, tid)
            _info(header)  # a header that does not parse is this line's fault
        except (ValueError, KeyError, TypeError, EngineError) as exc:
            detail = " ".join(str(exc).split()) or type(exc).__name__
            raise ArchiveError(f"{name}, line {number}: {detail}") from None
        if tid not in headers or header["last_seq"] > headers[tid]["last_seq"]:
            headers[tid] = header
        events.setdefault(tid, {})[event.seq] = event
    return {
        tid: ArchivedThread(_info(headers[tid]), [by_seq[s] for s in sorted(by_seq)])
        for tid, by_seq in events.items()
    }


def find_archived(threads: dict[str, ArchivedThread], ref: str, name: str) -> ArchivedThread:
    """A thread by id, or by ``CHANNEL/THREAD_TS``, as ``Store.resolve_thread`` finds one."""
    if "/" not in ref:
        if ref in threads:
            return threads[ref]
        raise ThreadNotFound(f"no thread {ref!r} in {name}")
    channel, _, ts = ref.partition("/")
    found = [t for t in threads.values() if (t.info.channel, t.info.root_ts) == (channel, ts)]
    if not found:
        raise ThreadNotFound(f"no thread {ref!r} in {name}")
    if len(found) > 1:
        ids = ", ".join(sorted(t.info.id for t in found))
        raise ThreadNotFound(f"{ref!r} is ambiguous in {name} (threads {ids}): use the thread id")
    return found[0]


__all__ = [
    "ArchiveError",
    "ArchiveRun",
    "ArchivedThread",
    "archive_lines",
    "archive_threads",
    "find_archived",
    "read_archive",
]
