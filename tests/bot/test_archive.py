"""``opsloop archive`` and ``opsloop trace --from``, run as real processes on SQLite and
PostgreSQL: ended threads move to the file and out of the hot tables, read back exactly
as the live trace showed them, and a SIGKILL between the file and the delete loses
nothing (engine/faults.py's ``archive_written`` point)."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engine import events as ev
from engine.archive import archive_lines, read_archive
from engine.store import ThreadKey, open_store
from engine.trace import trace_record
from engine.types import ThreadInfo
from tests.bot.test_cli import assert_one_line_error, json_lines, run_cli
from tests.engine.test_golden import GOLDENS, Golden
from tests.support.logs import answered, approval_pending, user

OLD = datetime.now(UTC) - timedelta(days=120)
RECENT = datetime.now(UTC) - timedelta(days=10)


async def seed(url: str) -> dict[str, str]:
    """Three ended threads from 120 days ago, and four that must stay."""
    store = await open_store(url)
    ids: dict[str, str] = {}

    async def thread(name: str, drafts: list[ev.Event], when: datetime = OLD) -> None:
        tid = await store.create_thread(ThreadKey("T1", "C1", f"17000000{len(ids)}.000100"))
        if drafts:
            await store.append(tid, 0, drafts, now=when)
        ids[name] = tid

    try:
        usage = ev.Usage(input_tokens=120, output_tokens=8)
        decision = ev.ModelDecision(actor="model", text="Up.", model="m", usage=usage)
        await thread("idle", [user("is the api up?"), decision, ev.FinalAnswer(text="Up.")])
        await thread("failed", [user(), ev.ErrorRaised(message="boom")])
        await thread("cancelled", [user(), ev.ThreadCancelled(actor="U0REQUEST", reason="no")])
        await thread("waiting", [user(), *approval_pending(expires_at=OLD + timedelta(days=999))])
        await thread("running", [user()])
        await thread("recent", [user(), *answered()], when=RECENT)
        await thread("new", [])
        return ids
    finally:
        await store.close()


async def remaining(url: str) -> set[str]:
    store = await open_store(url, create=False)
    try:
        return {t.id for t in await store.list_threads()}
    finally:
        await store.close()


ENDED = ("idle", "failed", "cancelled")


def test_archive_moves_ended_threads_and_trace_from_reads_them_back(
    db_url: str, tmp_path: Path
) -> None:
    ids = asyncio.run(seed(db_url))
    live = {
        name: (
            run_cli("trace", ids[name], db=db_url, cwd=tmp_path).stdout,
            run_cli("trace", ids[name], "--json", db=db_url, cwd=tmp_path).stdout,
        )
        for name in ENDED
    }
    dry = run_cli("archive", "--before", "90d", "--dry-run", db=db_url, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    *listed, summary = dry.stdout.splitlines()
    assert sorted(line.split()[0] for line in listed) == sorted(ids[n] for n in ENDED)
    assert summary == "would archive 3 threads (7 events); nothing changed"
    assert list(tmp_path.glob("*.jsonl")) == []  # no file, and the database is as it was
    assert asyncio.run(remaining(db_url)) == set(ids.values())

    out = tmp_path / "old.jsonl"
    proc = run_cli("archive", "--before", "90d", "--to", str(out), db=db_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"archived 3 threads (7 events) to {out}\n"
    assert asyncio.run(remaining(db_url)) == {ids[n] for n in ids if n not in ENDED}
    lines = json_lines(out.read_text())
    assert len(lines) == 7
    assert {(r["thread"]["thread_id"], r["thread"]["status"]) for r in lines} == {
        (ids[n], n) for n in ENDED
    }
    for name in ENDED:  # read back exactly as the live trace showed it
        human = run_cli("trace", "--from", str(out), ids[name], db=None, cwd=tmp_path)
        assert (human.returncode, human.stderr) == (0, "")
        assert human.stdout == live[name][0]
        records = run_cli("trace", "--from", str(out), ids[name], "--json", db=None, cwd=tmp_path)
        assert records.stdout == live[name][1]
    assert "usage: 1 model decision, input 120, output 8" in live["idle"][0]
    by_key = run_cli("trace", "--from", str(out), "C1/170000000.000100", db=None, cwd=tmp_path)
    assert by_key.stdout == live["idle"][0]

    again = run_cli("archive", "--before", "90d", "--to", str(out), db=db_url, cwd=tmp_path)
    assert again.stdout.startswith("archived 0 threads: none ended before ")
    assert len(json_lines(out.read_text())) == 7


def test_without_to_it_writes_a_dated_file_in_the_working_directory(
    sqlite_url: str, tmp_path: Path
) -> None:
    asyncio.run(seed(sqlite_url))
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli("archive", "--before", "30d", db=sqlite_url, cwd=work)
    assert proc.returncode == 0, proc.stderr
    [written] = list(work.iterdir())
    assert written.name == f"opsloop-archive-{datetime.now(UTC):%Y-%m-%d}.jsonl"
    assert proc.stdout == f"archived 3 threads (7 events) to ./{written.name}\n"


@pytest.mark.parametrize("value", ["90", "ninety days", "5days", "3w"])
def test_a_bad_duration_is_one_line_exit_2(sqlite_url: str, tmp_path: Path, value: str) -> None:
    asyncio.run(seed(sqlite_url))
    proc = run_cli("archive", "--before", value, db=sqlite_url, cwd=tmp_path)
    assert_one_line_error(proc, "opsloop archive: --before must be a duration", repr(value))
    assert len(asyncio.run(remaining(sqlite_url))) == 7


@pytest.mark.parametrize("zero", ["0s", "0m", "0h", "0d"])
def test_a_zero_cutoff_dry_run_lists_every_ended_thread(
    sqlite_url: str, tmp_path: Path, zero: str
) -> None:
    ids = asyncio.run(seed(sqlite_url))
    proc = run_cli("archive", "--before", zero, "--dry-run", db=sqlite_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    *listed, summary = proc.stdout.splitlines()
    # The thread that ended 10 days ago too, which 30d and 90d leave.
    ended = sorted(ids[n] for n in (*ENDED, "recent"))
    assert sorted(line.split()[0] for line in listed) == ended
    assert summary.startswith("would archive 4 threads (")


def test_a_zero_cutoff_archives_every_ended_thread_up_to_now(db_url: str, tmp_path: Path) -> None:
    ids = asyncio.run(seed(db_url))
    out = tmp_path / "all.jsonl"
    proc = run_cli("archive", "--before", "0s", "--to", str(out), db=db_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("archived 4 threads (") and str(out) in proc.stdout
    assert {line["thread"]["thread_id"] for line in json_lines(out.read_text())} == {
        ids[n] for n in (*ENDED, "recent")
    }
    # Whatever waits for a person, runs or has not started stays.
    assert asyncio.run(remaining(db_url)) == {ids[n] for n in ("waiting", "running", "new")}


def test_trace_from_a_missing_file_or_thread_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("trace", "--from", str(tmp_path / "no.jsonl"), "thr_x", db=None, cwd=tmp_path)
    assert_one_line_error(proc, "cannot read the archive", "no.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = run_cli("trace", "--from", str(empty), "thr_x", db=None, cwd=tmp_path)
    assert_one_line_error(proc, "no thread 'thr_x' in", "empty.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"archive": 1}\n')
    proc = run_cli("trace", "--from", str(bad), "thr_x", db=None, cwd=tmp_path)
    assert_one_line_error(proc, "bad.jsonl, line 1")


def test_a_sigkill_between_the_file_and_the_delete_loses_nothing(
    db_url: str, tmp_path: Path
) -> None:
    ids = asyncio.run(seed(db_url))
    out = tmp_path / "a.jsonl"
    args = ("archive", "--before", "90d", "--to", str(out))
    # Killed right after the second thread's lines are on disk, before its delete.
    killed = run_cli(*args, db=db_url, cwd=tmp_path, env={"OPSLOOP_FAULTS": "archive_written:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    after_kill = asyncio.run(remaining(db_url))
    in_file = read_archive(out.read_text())
    assert len(in_file) == 2
    order = [r["thread"]["thread_id"] for r in json_lines(out.read_text())]
    first, second = sorted(in_file, key=order.index)  # in the order they were written
    assert first not in after_kill  # in the file, gone from the database
    assert second in after_kill  # in the file and still whole in the database
    ended = {ids[n] for n in ENDED}
    assert len(ended & after_kill) == 2  # the second, and the one not reached

    # A crash while writing leaves a line without its newline: the next run cuts it.
    with out.open("ab") as file:
        file.write(b'{"archive": 1, "thread": {"thread_id": "thr_cut')

    rerun = run_cli(*args, db=db_url, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    rest = 7 - len(in_file[first].events)  # the second thread's events and the third's
    assert rerun.stdout == f"archived 2 threads ({rest} events) to {out}\n"

    assert asyncio.run(remaining(db_url)) == {ids[n] for n in ids if n not in ENDED}
    text = out.read_text()
    assert "thr_cut" not in text
    threads = read_archive(text)
    assert set(threads) == ended and all(t.complete for t in threads.values())
    # The second thread is in the file twice; the reading rule takes each seq once.
    assert sum(1 for r in json_lines(text) if r["thread"]["thread_id"] == second) == 2 * len(
        threads[second].events
    )
    proc = run_cli("trace", "--from", str(out), second, "--json", db=None, cwd=tmp_path)
    assert [r["seq"] for r in json_lines(proc.stdout)] == [e.seq for e in threads[second].events]


# --- the format, on the golden logs (every event type) -------------------------------------


def info_of(golden: Golden) -> ThreadInfo:
    events = golden.events
    key = golden.header["key"]
    return ThreadInfo(
        id=events[0].thread_id,
        team=key["team"],
        channel=key["channel"],
        root_ts=key["root_ts"],
        requester=events[0].actor,
        status=golden.header["status"],
        last_seq=events[-1].seq,
        wake_at=None,
        lease_owner=None,
        lease_expires_at=None,
        created_at=events[0].created_at,
        updated_at=events[-1].created_at,
    )


@pytest.mark.parametrize("golden", GOLDENS)
def test_every_event_reads_back_equal_to_what_was_archived(golden: Golden) -> None:
    info = info_of(golden)
    text = "".join(f"{line}\n" for line in archive_lines(info, golden.events))
    [back] = read_archive(text).values()
    assert back.events == golden.events
    assert [trace_record(e) for e in back.events] == [trace_record(e) for e in golden.events]
    assert (back.info.id, back.info.channel, back.info.root_ts) == (
        info.id,
        info.channel,
        info.root_ts,
    )
    assert (back.info.status, back.info.last_seq, back.info.requester) == (
        info.status,
        info.last_seq,
        info.requester,
    )
    assert back.complete


def test_copies_of_a_thread_are_read_once_and_a_cut_last_line_is_skipped() -> None:
    golden = Golden(GOLDENS[0].values[0].path)
    info = info_of(golden)
    lines = archive_lines(info, golden.events)
    # A crash after three lines, a re-run writing it all, then a write cut short.
    text = "".join(f"{line}\n" for line in [*lines[:3], *lines]) + lines[0][:40]
    [back] = read_archive(text).values()
    assert back.events == golden.events and back.complete
    partial = read_archive("".join(f"{line}\n" for line in lines[:3]))
    assert not next(iter(partial.values())).complete
    assert json.loads(lines[0])["schema_version"] == 1
