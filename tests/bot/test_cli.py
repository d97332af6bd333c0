"""The ``opsloop`` CLI, run as a real process against a database seeded through the Store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from bot.cli import KeyValueFormatter, main
from engine.events import Usage
from engine.inputs import post_user_message
from engine.models.base import Decision
from engine.models.scripted import ScriptedModel
from engine.runner import Runner
from engine.store import ThreadKey, open_store
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.slack import TOKEN as SLACK_TOKEN
from tests.fakes.slack import FakeSlack
from tools import ToolRegistry

ROOT = Path(__file__).resolve().parents[2]
KEY = ThreadKey("T1", "C1", "1700000000.000100")
OTHER = ThreadKey("T1", "C2", "1700000099.000200")
FRESH = ThreadKey("T1", "C3", "1700000111.000300")
SECRETS = {
    "SLACK_BOT_TOKEN": SLACK_TOKEN,
    "SLACK_SIGNING_SECRET": "sig-9b1c-secret",
    "ANTHROPIC_API_KEY": "test-key",
}


def run_cli(
    *args: str, db: str | None, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLACK_", "DATABASE_URL", "OPSLOOP_", "PORT"))
    }
    full["PYTHONPATH"] = str(ROOT)
    if db is not None:
        full["DATABASE_URL"] = db
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


async def seed(url: str) -> dict[str, str]:
    """Three threads: idle after a scripted answer, running (a message, no run yet), new."""
    store = await open_store(url)
    try:
        model = ScriptedModel(
            [Decision(text="It is up.", usage=Usage(input_tokens=120, output_tokens=8))]
        )
        answered = await post_user_message(
            store, KEY, text="is the api up?", user="U1", dedupe_key="Ev1"
        )
        state = await Runner(store, model, ToolRegistry()).run(answered.thread_id)
        assert state is not None and state.status == "idle"
        waiting = await post_user_message(store, OTHER, text="restart it", user="U7")
        fresh = await store.create_thread(FRESH)
        return {"idle": answered.thread_id, "running": waiting.thread_id, "new": fresh}
    finally:
        await store.close()


@pytest.fixture
def seeded(tmp_path: Path) -> tuple[str, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'seeded.db'}"
    return url, asyncio.run(seed(url))


# --- threads ------------------------------------------------------------------------


def test_threads_json_fields_and_values(seeded, tmp_path: Path) -> None:
    url, ids = seeded
    proc = run_cli("threads", "--json", db=url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    rows = {row["thread_id"]: row for row in json_lines(proc.stdout)}
    assert set(rows) == set(ids.values())
    for row in rows.values():
        assert list(row) == [
            "thread_id",
            "team",
            "channel",
            "thread_ts",
            "requester",
            "status",
            "last_seq",
            "updated_at",
            "events",
            "bytes",
        ]
        assert datetime.fromisoformat(row["updated_at"]).utcoffset().total_seconds() == 0
    idle = rows[ids["idle"]]
    assert (idle["team"], idle["channel"], idle["thread_ts"]) == ("T1", "C1", KEY.root_ts)
    assert (idle["requester"], idle["status"], idle["last_seq"]) == ("U1", "idle", 3)
    assert idle["events"] == 3 and idle["bytes"] == _payload_bytes(url, ids["idle"])
    assert (rows[ids["new"]]["events"], rows[ids["new"]]["bytes"]) == (0, 0)
    running = rows[ids["running"]]
    assert (running["requester"], running["status"], running["last_seq"]) == ("U7", "running", 1)
    new = rows[ids["new"]]
    assert (new["requester"], new["status"], new["last_seq"]) == (None, "new", 0)


def test_threads_status_filter(seeded, tmp_path: Path) -> None:
    url, ids = seeded
    for status in ("idle", "running"):
        proc = run_cli("threads", "--status", status, "--json", db=url, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert [row["thread_id"] for row in json_lines(proc.stdout)] == [ids[status]]
    proc = run_cli("threads", "--status", "failed", "--json", db=url, cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, "")


def test_threads_human_table(seeded, tmp_path: Path) -> None:
    url, ids = seeded
    proc = run_cli("threads", db=url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.splitlines()
    assert header.split() == [
        "ID",
        "CHANNEL/THREAD_TS",
        "STATUS",
        "LAST_SEQ",
        "EVENTS",
        "BYTES",
        "UPDATED",
    ]
    assert len(rows) == 3
    idle_row = next(r for r in rows if r.startswith(ids["idle"]))
    size = str(_payload_bytes(url, ids["idle"]))
    assert idle_row.split()[1:6] == [f"C1/{KEY.root_ts}", "idle", "3", "3", size]


def _payload_bytes(url: str, thread_id: str) -> int:
    """What `opsloop threads` should count: the stored payloads' UTF-8 octets."""
    path = url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT payload FROM events WHERE thread_id = ?", (thread_id,))
        return sum(len(p.encode()) for (p,) in rows)


async def _empty_database(url: str) -> None:
    store = await open_store(url)  # what `serve` leaves before the first message
    await store.close()


def test_threads_on_a_database_without_threads_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    asyncio.run(_empty_database(url))
    proc = run_cli("threads", db=url, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "no threads yet\n", "")
    proc = run_cli("threads", "--status", "failed", db=url, cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, "no threads with status failed\n")
    proc = run_cli("threads", "--json", db=url, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")  # JSON lines: none


@pytest.mark.parametrize(
    "args",
    [
        ["threads"],
        ["threads", "--json"],
        ["trace", "thr_x"],
        ["replay", "thr_x", "--all"],
        ["archive", "--before", "90d"],  # not read-only, but nothing to archive: no file either
    ],
)
def test_a_read_only_command_in_the_wrong_directory_creates_no_database(
    tmp_path: Path, args: list[str]
) -> None:
    proc = run_cli(*args, db=None, cwd=tmp_path)
    line = assert_one_line_error(proc)
    assert line == "opsloop: no opsloop database at ./opsloop.db (set DATABASE_URL)"
    assert list(tmp_path.iterdir()) == []  # no ./opsloop.db, no -wal, nothing
    missing = tmp_path / "elsewhere" / "ops.db"
    proc = run_cli(*args, db=f"sqlite:///{missing}", cwd=tmp_path)
    assert assert_one_line_error(proc) == (
        f"opsloop: no opsloop database at {missing} (set DATABASE_URL)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_an_opsloop_database_is_not_changed(tmp_path: Path) -> None:
    other = tmp_path / "notes.db"
    other.write_bytes(b"")
    proc = run_cli("threads", db=f"sqlite:///{other}", cwd=tmp_path)
    assert_one_line_error(proc, "no opsloop database at ", "notes.db", "(set DATABASE_URL)")
    assert other.read_bytes() == b""  # not opened, so not written to

    foreign = tmp_path / "foreign.db"
    with contextlib.closing(sqlite3.connect(foreign)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    proc = run_cli("trace", "thr_x", db=f"sqlite:///{foreign}", cwd=tmp_path)
    assert_one_line_error(proc, "no opsloop database at ", "foreign.db")
    with contextlib.closing(sqlite3.connect(foreign)) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"notes"}  # no opsloop tables were created in it


# --- trace --------------------------------------------------------------------------


def test_trace_json_by_id_and_by_channel_ts(seeded, tmp_path: Path) -> None:
    url, ids = seeded
    by_id = run_cli("trace", ids["idle"], "--json", db=url, cwd=tmp_path)
    assert by_id.returncode == 0, by_id.stderr
    records = json_lines(by_id.stdout)
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert [r["type"] for r in records] == ["user_message", "model_decision", "final_answer"]
    for r in records:
        assert list(r)[:5] == ["seq", "event_id", "type", "created_at", "actor"]
        assert r["event_id"].startswith("evt_")
        assert "thread_id" not in r
        datetime.fromisoformat(r["created_at"])
    first, decision, final = records
    assert (first["actor"], first["text"], first["dedupe_key"]) == ("U1", "is the api up?", "Ev1")
    assert decision["actor"] == "model"
    assert decision["usage"]["input_tokens"] == 120
    assert "dedupe_key" not in decision
    assert final["text"] == "It is up."

    by_key = run_cli("trace", f"C1/{KEY.root_ts}", "--json", db=url, cwd=tmp_path)
    assert by_key.returncode == 0, by_key.stderr
    assert json_lines(by_key.stdout) == records


def test_trace_human_has_header_one_line_per_event_and_usage(seeded, tmp_path: Path) -> None:
    url, ids = seeded
    proc = run_cli("trace", f"C1/{KEY.root_ts}", db=url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    header, *events, usage = proc.stdout.splitlines()
    assert ids["idle"] in header and f"C1/{KEY.root_ts}" in header
    assert "status=idle" in header and "requester=U1" in header
    assert len(events) == 3
    for seq, (line, kind) in enumerate(
        zip(events, ["user_message", "model_decision", "final_answer"], strict=True), start=1
    ):
        assert line.split()[0] == str(seq)
        assert kind in line.split()
    assert events[0].endswith("is the api up?")
    assert events[1].endswith("final: It is up.")
    assert usage.startswith("usage: 1 model decision,")
    assert "input 120" in usage and "output 8" in usage


def test_trace_without_usage_has_no_usage_line(seeded, tmp_path: Path) -> None:
    url, ids = seeded
    proc = run_cli("trace", ids["running"], db=url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2  # header, user_message
    assert "user_message" in lines[1]
    assert not any(line.startswith("usage:") for line in lines)


@pytest.mark.parametrize(("ref", "flags"), [("thr_nope", []), ("C9/1.2", ["--json"])])
def test_trace_unknown_thread_is_one_line_exit_2(
    seeded, tmp_path: Path, ref: str, flags: list[str]
) -> None:
    url, _ = seeded
    proc = run_cli("trace", ref, *flags, db=url, cwd=tmp_path)
    assert assert_one_line_error(proc) == f"opsloop: no thread {ref!r}"


# --- bad settings -------------------------------------------------------------------


@pytest.mark.parametrize("args", [["threads", "--json"], ["trace", "thr_x"]])
def test_bad_database_scheme_is_one_line_exit_2(tmp_path: Path, args: list[str]) -> None:
    proc = run_cli(*args, db="mysql://x", cwd=tmp_path)
    assert_one_line_error(proc, "opsloop: ", "DATABASE_URL", "mysql")


@pytest.mark.parametrize("args", [["threads"], ["trace", "thr_x", "--json"]])
def test_unreachable_database_is_one_line_exit_2(tmp_path: Path, args: list[str]) -> None:
    proc = run_cli(*args, db="postgresql://postgres:hunter2@127.0.0.1:1/x", cwd=tmp_path)
    line = assert_one_line_error(proc, "opsloop: ", "cannot reach the database", "127.0.0.1:1")
    assert "hunter2" not in line


def test_serve_without_slack_settings_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_cli("serve", db=f"sqlite:///{tmp_path / 'x.db'}", cwd=tmp_path)
    line = assert_one_line_error(proc)
    assert line == (
        "opsloop serve: set SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET and ANTHROPIC_API_KEY "
        "(see README: Configuration)"
    )
    proc = run_cli(
        "serve", db=None, cwd=tmp_path, env={"SLACK_BOT_TOKEN": SECRETS["SLACK_BOT_TOKEN"]}
    )
    line = assert_one_line_error(proc, "SLACK_SIGNING_SECRET and ANTHROPIC_API_KEY")
    assert "SLACK_BOT_TOKEN" not in line
    assert not (tmp_path / "opsloop.db").exists()  # nothing was started


def test_serve_with_a_broken_tool_module_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {**SECRETS, "OPSLOOP_TOOLS": "no_such_tools_module"}
    proc = run_cli("serve", db=f"sqlite:///{tmp_path / 'x.db'}", cwd=tmp_path, env=env)
    line = assert_one_line_error(proc, "opsloop: ", "no_such_tools_module")
    assert SECRETS["SLACK_BOT_TOKEN"] not in line


def test_serve_with_an_unreachable_database_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_cli("serve", db="postgresql://postgres@127.0.0.1:1/x", cwd=tmp_path, env=SECRETS)
    assert_one_line_error(proc, "opsloop: cannot reach the database")


@pytest.mark.parametrize(
    ("name", "value"),
    [("PORT", "http"), ("OPSLOOP_APPROVERS", "bob"), ("OPSLOOP_LEASE_SECONDS", "soon")],
)
def test_serve_with_a_bad_setting_is_one_line_exit_2(tmp_path: Path, name: str, value: str) -> None:
    proc = run_cli("serve", db=None, cwd=tmp_path, env={**SECRETS, name: value})
    assert_one_line_error(proc, name, repr(value))
    assert not (tmp_path / "opsloop.db").exists()  # refused before touching anything


def test_socket_without_its_settings_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_cli("socket", db=None, cwd=tmp_path, env={"SLACK_BOT_TOKEN": "xoxb-1"})
    line = assert_one_line_error(proc)
    assert line == (
        "opsloop socket: set SLACK_APP_TOKEN and ANTHROPIC_API_KEY (see README: Configuration)"
    )


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: opsloop" in err
    for command in ("serve", "socket", "local", "threads", "trace"):
        assert command in err


# --- serve --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=3) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"body": raw.decode(errors="replace")}


async def _post(url: str, text: str) -> str:
    store = await open_store(url)
    try:
        return (await post_user_message(store, KEY, text=text, user="U1")).thread_id
    finally:
        await store.close()


async def _final_answer(url: str, thread_id: str) -> str | None:
    store = await open_store(url)
    try:
        events = await store.select_events(thread_id)
    finally:
        await store.close()
    return next((e.text for e in events if e.type == "final_answer"), None)


@contextlib.contextmanager
def fakes_in_a_thread() -> Iterator[tuple[FakeAnthropic, FakeSlack]]:
    """The fake Messages and Slack Web APIs on their own event loop, for a test that
    blocks on a process."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    claude, slack = FakeAnthropic(), FakeSlack()
    for fake in (claude, slack):
        asyncio.run_coroutine_threadsafe(fake.__aenter__(), loop).result(10)
    try:
        yield claude, slack
    finally:
        for fake in (claude, slack):
            asyncio.run_coroutine_threadsafe(fake.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.slow
def test_serve_answers_healthz_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    with fakes_in_a_thread() as (claude, slack):
        claude.text("Yes, I am here.")
        slack.add_message(KEY.channel, "anyone there?", user="U1", ts=KEY.root_ts)
        _serve_and_stop(tmp_path, claude, slack)
        claude.assert_clean()
        # The answer was shown in the Slack thread, once (streamed into the run's plan).
        assert len(slack.showing("Yes, I am here.")) == 1


def _serve_and_stop(tmp_path: Path, claude: FakeAnthropic, slack: FakeSlack) -> None:
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    waiting = asyncio.run(_post(db, "anyone there?"))
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLACK_", "DATABASE_URL", "OPSLOOP_", "PORT"))
    }
    env.update(
        SECRETS,
        PYTHONPATH=str(ROOT),
        DATABASE_URL=db,
        ANTHROPIC_BASE_URL=claude.url,
        SLACK_API_URL=slack.url,
        OPSLOOP_HOST="127.0.0.1",
        PORT=str(port),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                status, body = _http("GET", f"{base}/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "serve did not answer in time"
                time.sleep(0.1)
        assert (status, body) == (200, {"status": "ok"})
        unsigned = _http("POST", f"{base}/slack/events")
        assert unsigned[0] == 401  # Slack's signature is checked before anything
        # The worker runs: the thread left waiting gets Claude's answer (the fake's).
        while (answer := asyncio.run(_final_answer(db, waiting))) is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker did not run the thread"
            time.sleep(0.2)
        assert answer == "Yes, I am here."
        # …and shows it in the Slack thread before we stop it.
        while not slack.showing("Yes, I am here."):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the answer was not posted to Slack"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines, "serve logs what it does"
    for line in lines:
        assert line.startswith("time=") and " level=" in line and " logger=" in line, line
        assert " msg=" in line, line
    assert any("msg=stopped" in line for line in lines)
    for secret in SECRETS.values():
        assert secret not in err


def test_log_formatter_is_key_value_and_masks_secrets() -> None:
    import logging

    formatter = KeyValueFormatter(secrets=["xoxb-abc-123", ""])
    record = logging.LogRecord(
        "opsloop.test", logging.INFO, __file__, 1, 'token %s said "hi"', ("xoxb-abc-123",), None
    )
    line = formatter.format(record)
    assert line.startswith("time=")
    assert " level=INFO logger=opsloop.test msg=" in line
    assert "xoxb-abc-123" not in line
    assert 'msg="token *** said \\"hi\\""' in line
    plain = logging.LogRecord("x", logging.WARNING, __file__, 1, "stopped", (), None)
    assert formatter.format(plain).endswith("level=WARNING logger=x msg=stopped")


# --- PostgreSQL ---------------------------------------------------------------------


@pytest.mark.postgres
def test_threads_and_trace_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    ids = asyncio.run(seed(pg_url))
    proc = run_cli("threads", "--json", db=pg_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {row["thread_id"]: row for row in json_lines(proc.stdout)}
    assert set(rows) == set(ids.values())
    assert rows[ids["idle"]]["status"] == "idle"
    assert rows[ids["idle"]]["last_seq"] == 3
    proc = run_cli("threads", "--status", "running", "--json", db=pg_url, cwd=tmp_path)
    assert [row["thread_id"] for row in json_lines(proc.stdout)] == [ids["running"]]
    proc = run_cli("trace", f"C1/{KEY.root_ts}", "--json", db=pg_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["seq"] for r in json_lines(proc.stdout)] == [1, 2, 3]


@pytest.mark.parametrize("command", ["serve", "local"])
def test_a_busy_port_says_to_set_port_in_one_line(tmp_path: Path, command: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**SECRETS, "OPSLOOP_HOST": "127.0.0.1", "PORT": str(port)}
        proc = run_cli(command, db=f"sqlite:///{tmp_path / 'x.db'}", cwd=tmp_path, env=env)
    line = assert_one_line_error(proc)
    assert line == (
        f"opsloop {command}: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(set PORT to another port)"
    )
    assert not (tmp_path / "x.db").exists()  # refused before anything started


# --- the schema ---------------------------------------------------------------------


def _revision(db: str) -> tuple[str | None, bool]:
    from engine.migrations import inspect_schema

    state = asyncio.run(inspect_schema(db))
    return state.revision, state.stamped


def test_migrate_takes_a_database_from_before_migrations_to_the_head(tmp_path: Path) -> None:
    from engine.schema import BASELINE, HEAD
    from tests.support.legacy import make_legacy_database

    db = f"sqlite:///{tmp_path / 'old.db'}"
    asyncio.run(make_legacy_database(db))
    check = run_cli("migrate", "--check", db=db, cwd=tmp_path)
    assert check.returncode == 1 and check.stderr == ""
    assert f"schema revision {BASELINE}, this release's {HEAD}: older" in check.stdout

    done = run_cli("migrate", db=db, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"schema migrated from {BASELINE} to revision {HEAD}")
    assert _revision(db) == (HEAD, True)
    again = run_cli("migrate", db=db, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.strip().endswith(f"already at revision {HEAD}")
    assert run_cli("migrate", "--check", db=db, cwd=tmp_path).returncode == 0
    # The old thread reads as it was written.
    trace = run_cli("trace", "thr_old", "--json", db=db, cwd=tmp_path)
    assert json_lines(trace.stdout)[0]["type"] == "user_message"


@pytest.mark.parametrize("command", ["serve", "socket", "local"])
def test_serving_refuses_an_older_schema_in_one_line_and_changes_nothing(
    tmp_path: Path, command: str
) -> None:
    from engine.schema import BASELINE
    from tests.support.legacy import make_legacy_database

    db = f"sqlite:///{tmp_path / 'old.db'}"
    asyncio.run(make_legacy_database(db))
    env = {**SECRETS, "SLACK_APP_TOKEN": "xapp-1-test", "PORT": str(_free_port())}
    proc = run_cli(command, db=db, cwd=tmp_path, env=env)
    line = assert_one_line_error(proc, "opsloop: ", "older", "opsloop migrate")
    assert SECRETS["SLACK_BOT_TOKEN"] not in line
    assert _revision(db) == (BASELINE, False)


def test_serve_refuses_a_schema_newer_than_it_knows_even_with_auto_migrate(
    tmp_path: Path,
) -> None:
    from tests.support.legacy import run_sql

    db = f"sqlite:///{tmp_path / 'new.db'}"
    assert run_cli("migrate", db=db, cwd=tmp_path).returncode == 0
    asyncio.run(run_sql(db, "UPDATE alembic_version SET version_num = '0099'"))
    env = {**SECRETS, "OPSLOOP_AUTO_MIGRATE": "true", "PORT": str(_free_port())}
    proc = run_cli("serve", db=db, cwd=tmp_path, env=env)
    assert_one_line_error(proc, "opsloop: ", "0099", "newer opsloop")
    assert _revision(db) == ("0099", True)


def test_auto_migrate_migrates_at_start(tmp_path: Path) -> None:
    """The schema is migrated before anything else starts: here a broken tool module
    then stops serve, after the migration."""
    from engine.schema import HEAD
    from tests.support.legacy import make_legacy_database

    db = f"sqlite:///{tmp_path / 'old.db'}"
    asyncio.run(make_legacy_database(db))
    env = {
        **SECRETS,
        "OPSLOOP_AUTO_MIGRATE": "true",
        "OPSLOOP_TOOLS": "no_such_tools_module",
        "PORT": str(_free_port()),
    }
    proc = run_cli("serve", db=db, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    migrated, failed = proc.stderr.splitlines()
    assert f'msg="database schema migrated from 0001 to {HEAD}"' in migrated
    assert "no_such_tools_module" in failed
    assert _revision(db) == (HEAD, True)


def test_a_bad_auto_migrate_flag_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("serve", db=None, cwd=tmp_path, env={**SECRETS, "OPSLOOP_AUTO_MIGRATE": "maybe"})
    assert_one_line_error(proc, "OPSLOOP_AUTO_MIGRATE", "'maybe'")
