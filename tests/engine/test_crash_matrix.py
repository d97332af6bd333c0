"""Crash matrix: SIGKILL a real process at every boundary; a fresh one finishes.

For every kill point, on SQLite and PostgreSQL: the log is legal, each input appears
once, each side effect happened once (counted outside the process), one final answer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from subprocess import PIPE

import pytest

from engine.state import reduce
from engine.store import open_store
from tests.support import crash_child, mcp_counter_server
from tests.support.processes import CHILD, child_env, lines, run_child

# Commits of one undisturbed run: message, lookup decision+start, lookup result,
# deploy decision+approval request, approval, deploy start, deploy result, answer.
COMMITS = 8
KILL_POINTS = [f"append:{k}" for k in range(1, COMMITS + 1)] + ["tool_effect:1", "tool_effect:2"]

pytestmark = pytest.mark.slow


async def test_an_undisturbed_run_makes_exactly_the_commits_the_matrix_kills_after(
    db_url, tmp_path
):
    done = run_child(db_url, tmp_path, None)
    assert done.returncode == 0, done.stderr
    store = await open_store(db_url)
    try:
        (info,) = await store.list_threads()
        assert info.last_seq > 0
        events = await store.select_events(info.id)
    finally:
        await store.close()
    # One transaction per boundary: the count of kill points covers each of them.
    commits = {e.created_at for e in events}  # a batch shares its commit time
    assert len(commits) == COMMITS
    assert [e.type for e in events][-1] == "final_answer"


@pytest.mark.parametrize("kill_at", KILL_POINTS)
async def test_sigkill_at_each_boundary_then_a_fresh_process_finishes(db_url, tmp_path, kill_at):
    first = run_child(db_url, tmp_path, kill_at)
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-2000:])

    second = run_child(db_url, tmp_path, None)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.strip() == "idle"

    store = await open_store(db_url)
    try:
        (info,) = await store.list_threads()
        events = await store.select_events(info.id)
        loaded = await store.load(info.id)
    finally:
        await store.close()

    # The log is legal: it folds from scratch, seqs 1..n without gaps.
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    state = reduce(events)
    assert state.status == "idle" == loaded.status == info.status
    types = Counter(e.type for e in events)
    assert types["user_message"] == 1
    assert types["approval_granted"] == 1
    assert types["final_answer"] == 1
    assert types["tool_call_requested"] == 2
    assert types["tool_result"] == 2

    # Each side effect happened once, whatever number of invocations it took.
    effects = Counter(line.split()[0] for line in lines(tmp_path / "effects.log"))
    assert effects == Counter({"lookup": 1, "deploy": 1})
    invoked = lines(tmp_path / "invocations.log")
    keys = {line.split()[1] for line in invoked}
    assert len(keys) == 2  # one idempotency key per call, on every attempt
    if kill_at.startswith("tool_effect"):
        assert len(invoked) == 3  # the killed attempt ran again, with the same key


def run_unknown(db_url, tmp_path, faults: str | None, reconcile: str | None = None):
    """The crash child driving one non-idempotent call (a Python ``@tool(idempotent=False)``)."""
    env = child_env(db_url, tmp_path, faults)
    env["CRASH_SCENARIO"] = "unknown"
    env.pop("RECONCILE", None)
    if reconcile:
        env["RECONCILE"] = reconcile
    return subprocess.run(
        [sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=90
    )


@pytest.mark.parametrize(("decision", "runs"), [("retry", 2), ("happened", 1), ("abandon", 1)])
async def test_a_non_idempotent_call_killed_mid_flight_runs_again_only_if_a_person_says(
    db_url, tmp_path, decision, runs
):
    first = run_unknown(db_url, tmp_path, "tool_effect:1")
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-2000:])
    assert len(lines(tmp_path / "restarts.log")) == 1

    # A fresh process does not run it again: the outcome is unknown, a person decides.
    second = run_unknown(db_url, tmp_path, None)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.strip() == "awaiting_reconcile"
    assert len(lines(tmp_path / "restarts.log")) == 1
    store = await open_store(db_url)
    try:
        (info,) = await store.list_threads()
        events = await store.select_events(info.id)
    finally:
        await store.close()
    types = [e.type for e in events]
    assert types[-3:] == ["tool_call_requested", "tool_started", "tool_outcome_unknown"]
    assert info.status == "awaiting_reconcile"

    third = run_unknown(db_url, tmp_path, None, reconcile=decision)
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.stdout.strip() == "idle"
    restarts = lines(tmp_path / "restarts.log")
    assert len(restarts) == runs
    assert len({line.split()[1] for line in restarts}) == 1  # the same key on a retry
    store = await open_store(db_url)
    try:
        events = await store.select_events(info.id)
    finally:
        await store.close()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert reduce(events).status == "idle"
    assert Counter(e.type for e in events)["reconcile_decided"] == 1


def mcp_child_env(db_url, tmp_path, *, hold_s: float = 0, reconcile: str | None = None):
    env = child_env(db_url, tmp_path)
    env.update(CRASH_SCENARIO="mcp", MCP_HOLD_S=str(hold_s))
    env.pop("RECONCILE", None)
    if reconcile:
        env["RECONCILE"] = reconcile
    return env


def run_mcp(db_url, tmp_path, reconcile: str | None = None) -> subprocess.CompletedProcess:
    """The crash child calling a real stdio MCP server (tests/support/mcp_counter_server.py)."""
    env = mcp_child_env(db_url, tmp_path, reconcile=reconcile)
    return subprocess.run(
        [sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=60
    )


def kill_mid_mcp_call(db_url, tmp_path) -> subprocess.CompletedProcess:
    """Start the child with the server holding the call open; SIGKILL the child once the
    counter file shows the server made its effect, before any answer comes back."""
    env = mcp_child_env(db_url, tmp_path, hold_s=120)
    child = subprocess.Popen([sys.executable, str(CHILD)], env=env, stdout=PIPE, stderr=PIPE)
    try:
        deadline = time.monotonic() + 30
        while mcp_counter_server.count(tmp_path) == 0:
            assert child.poll() is None, child.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the MCP call never made its effect"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        try:  # the server shares the child's stderr: this returns once it exited too
            out, err = child.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("the MCP server outlived the SIGKILLed child that started it")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out.decode(), err.decode())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by whoever adopted it) is gone too
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def assert_no_server_left(tmp_path: Path, servers: int) -> None:
    pids = [int(p) for p in lines(tmp_path / mcp_counter_server.PIDS)]
    assert len(pids) == servers  # one server per child process
    deadline = time.monotonic() + 5
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], f"MCP server processes outlived their client: {left}"


@pytest.fixture
def reap_mcp_servers(tmp_path):
    """Even when a test fails, no MCP server it started outlives it."""
    yield
    for pid in map(int, lines(tmp_path / mcp_counter_server.PIDS)):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.usefixtures("reap_mcp_servers")
@pytest.mark.parametrize(("decision", "runs"), [("retry", 2), ("happened", 1)])
async def test_a_real_mcp_call_killed_mid_flight_runs_again_only_if_a_person_says(
    db_url, tmp_path, decision, runs
):
    first = kill_mid_mcp_call(db_url, tmp_path)
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-2000:])
    assert mcp_counter_server.count(tmp_path) == 1
    assert_no_server_left(tmp_path, 1)
    store = await open_store(db_url)
    try:
        (info,) = await store.list_threads()
        types = [e.type for e in await store.select_events(info.id)]
    finally:
        await store.close()
    assert "approval_granted" in types  # MCP tools default to approve_before_run
    assert types[-1] == "tool_started"  # killed between the effect and its tool_result

    # A fresh process does not call the server again: a person decides.
    second = run_mcp(db_url, tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.strip() == "awaiting_reconcile"
    assert mcp_counter_server.count(tmp_path) == 1
    assert_no_server_left(tmp_path, 2)
    store = await open_store(db_url)
    try:
        (info,) = await store.list_threads()
        events = await store.select_events(info.id)
    finally:
        await store.close()
    assert [e.type for e in events][-2:] == ["tool_started", "tool_outcome_unknown"]
    assert info.status == "awaiting_reconcile"

    third = run_mcp(db_url, tmp_path, reconcile=decision)
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.stdout.strip() == "idle"
    assert mcp_counter_server.count(tmp_path) == runs
    assert_no_server_left(tmp_path, 3)
    store = await open_store(db_url)
    try:
        events = await store.select_events(info.id)
    finally:
        await store.close()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert reduce(events).status == "idle"
    types = Counter(e.type for e in events)
    assert types["reconcile_decided"] == 1
    assert types["tool_outcome_unknown"] == 1
    assert types["tool_result"] == (1 if decision == "retry" else 0)
    assert types["final_answer"] == 1


def test_child_script_matches_the_matrix():
    assert len(crash_child.SCRIPT) == 3


async def test_two_processes_driving_one_thread_at_once_never_double_anything(db_url, tmp_path):
    env = child_env(db_url, tmp_path)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), env=env, stdout=PIPE, stderr=PIPE
        )
        for _ in range(2)
    ]
    async with asyncio.timeout(90):
        outputs = await asyncio.gather(*(p.communicate() for p in procs))
    assert [p.returncode for p in procs] == [0, 0], [err.decode()[-3000:] for _, err in outputs]

    store = await open_store(db_url)
    try:
        (info,) = await store.list_threads()
        events = await store.select_events(info.id)
    finally:
        await store.close()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = Counter(e.type for e in events)
    assert types["user_message"] == 1  # both posted it; the dedupe key kept one
    assert types["model_decision"] == 3  # no decision was taken twice
    assert types["approval_granted"] == 1
    assert types["final_answer"] == 1
    # No tool ran twice: one invocation per call, no retries needed.
    assert Counter(line.split()[0] for line in lines(tmp_path / "invocations.log")) == Counter(
        {"lookup": 1, "deploy": 1}
    )
