"""The demo tools: real rows in a SQLite file, idempotent by key, a job that outlives
its process, and a health check that fails once."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest

import tools
from engine.config import load_settings
from tools import REGISTRY, RetryableToolError, ToolContext, WaitFor, builtin

MODULE = "tools.demo"


@contextlib.contextmanager
def demo_loaded() -> Iterator[ModuleType]:
    """``tools.demo`` imported (its tools in the global REGISTRY) for one test only.

    The CLI builds its prompts from REGISTRY, so tools left there would change the
    prompt hashes other tests compare with a fresh process. A module imported here is
    forgotten afterwards, so a later ``load_tools("tools.demo")`` registers it again.
    """
    was_loaded = MODULE in sys.modules
    before = set(REGISTRY.names())
    module = importlib.import_module(MODULE)
    # Configured as `opsloop` configures its tool modules: from the settings, which a
    # test gives through the environment (the demo's and the docs' folder, here).
    saved = (module._url, builtin.docs._docs_dir, builtin.tickets._url)
    tool_settings = load_settings().tool
    module.configure(tool_settings)
    builtin.configure(tool_settings)
    try:
        yield module
    finally:
        module._url, builtin.docs._docs_dir, builtin.tickets._url = saved
        if not was_loaded:
            for name in set(REGISTRY.names()) - before:
                REGISTRY.unregister(name)
            sys.modules.pop(MODULE, None)
            if getattr(tools, "demo", None) is module:
                delattr(tools, "demo")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "demo.db"
    monkeypatch.setenv("OPSLOOP_DEMO_URL", f"sqlite:///{path}")
    return path


@pytest.fixture
async def demo(
    db: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ModuleType]:
    with demo_loaded() as module:
        monkeypatch.setattr(module, "_now", clock)
        try:
            yield module
        finally:
            await module.dispose_demo_engines()


def ctx(
    key: str = "thr_1:toolu_1", attempt: int = 1, requester: str | None = "U_ANN"
) -> ToolContext:
    thread_id, _, call_id = key.partition(":")
    return ToolContext(thread_id, call_id, key, attempt, requester)


def rows(path: Path, sql: str) -> list[tuple]:
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


def deployments(path: Path) -> list[tuple]:
    return rows(
        path,
        "SELECT id, idempotency_key, thread_id, service, version, environment, requested_by"
        " FROM deployments ORDER BY id",
    )


# --- deploy -----------------------------------------------------------------------------


async def test_deploy_twice_with_one_key_makes_one_deployment(demo, db) -> None:
    args = demo.DeployArgs(service="api", version="1.4.2", environment="production")
    first = await demo.deploy(args, ctx("thr_1:toolu_1"))
    # A retry after a crash, even with other arguments, returns the deployment made.
    again = await demo.deploy(demo.DeployArgs(service="web"), ctx("thr_1:toolu_1", attempt=2))
    expected = {"deployment": 1, "service": "api", "version": "1.4.2", "environment": "production"}
    assert first == again == expected
    assert deployments(db) == [(1, "thr_1:toolu_1", "thr_1", "api", "1.4.2", "production", "U_ANN")]


async def test_concurrent_attempts_with_one_key_deploy_once(demo, db) -> None:
    args = demo.DeployArgs(service="api")
    results = await asyncio.gather(*(demo.deploy(args, ctx("thr_1:race")) for _ in range(5)))
    assert {r["deployment"] for r in results} == {1}
    assert len(deployments(db)) == 1


async def test_without_a_version_the_next_one_of_that_service_is_deployed(demo, db) -> None:
    auto = demo.DeployArgs(service="api")
    assert (await demo.deploy(auto, ctx("t:1")))["version"] == "1.0.0"
    assert (await demo.deploy(auto, ctx("t:2")))["version"] == "1.0.1"
    await demo.deploy(demo.DeployArgs(service="api", version="1.4.2"), ctx("t:3"))
    assert (await demo.deploy(auto, ctx("t:4")))["version"] == "1.4.3"
    assert (await demo.deploy(demo.DeployArgs(service="web"), ctx("t:5")))["version"] == "1.0.0"
    assert [(r[0], r[3], r[4], r[5]) for r in deployments(db)] == [
        (1, "api", "1.0.0", "staging"),
        (2, "api", "1.0.1", "staging"),
        (3, "api", "1.4.2", "staging"),
        (4, "api", "1.4.3", "staging"),
        (5, "web", "1.0.0", "staging"),
    ]


@pytest.mark.parametrize(
    ("previous", "expected"),
    [(None, "1.0.0"), ("1.0.0", "1.0.1"), ("2.9", "2.10"), ("7", "8"), ("1.4.2-rc1", "1.0.0")],
)
def test_next_version(previous: str | None, expected: str) -> None:
    with demo_loaded() as demo:
        assert demo.next_version(previous) == expected


def test_deploy_arguments_are_checked() -> None:
    with demo_loaded() as demo:
        with pytest.raises(ValueError):
            demo.DeployArgs(service="api; rm -rf /")
        with pytest.raises(ValueError):
            demo.DeployArgs(service="api", environment="dev")
        schema = demo.deploy.input_schema()
    assert schema["required"] == ["service"]
    assert schema["properties"]["environment"]["enum"] == ["staging", "production"]


async def test_an_unreachable_database_is_retryable(demo, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(demo, "_url", f"sqlite:///{tmp_path}/missing/dir/demo.db")
    before = set(threading.enumerate())
    with pytest.raises(RetryableToolError, match="demo database unavailable"):
        await demo.deploy(demo.DeployArgs(service="api"), ctx())
    # aiosqlite stops a connection that failed to open without awaiting it: let its worker
    # thread post its last callback while this test's loop is still open, or it raises
    # "Event loop is closed" in whichever test runs next.
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=5)
    await asyncio.sleep(0)


def test_url_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPSLOOP_DEMO_URL, else DATABASE_URL, else a local file: chosen by the settings and
    handed to the module by ``configure``; the module reads no environment."""
    with demo_loaded() as demo:
        for env, url in [
            ({}, "sqlite:///opsloop.db"),
            ({"DATABASE_URL": "postgres://u@h/db"}, "postgres://u@h/db"),
            (
                {"DATABASE_URL": "postgres://u@h/db", "OPSLOOP_DEMO_URL": "sqlite:///d.db"},
                "sqlite:///d.db",
            ),
        ]:
            demo.configure(load_settings(env).tool)
            monkeypatch.setenv("OPSLOOP_DEMO_URL", "sqlite:///not-read.db")
            assert demo.demo_url() == url


# --- run_job ----------------------------------------------------------------------------


async def test_a_job_is_started_once_per_key_and_waited_for(demo, db, clock) -> None:
    args = demo.RunJobArgs(name="backfill", seconds=20)
    wait = await demo.run_job(args, ctx("thr_1:toolu_2"))
    clock.advance(5)  # a retry after a crash, later: the same job, same start
    again = await demo.run_job(args, ctx("thr_1:toolu_2", attempt=2))
    assert isinstance(wait, WaitFor) and wait == again
    assert wait.data == {"job_id": 1}
    assert (wait.timeout_s, wait.poll_every_s) == (90, 2.0)
    assert rows(db, "SELECT id, idempotency_key, name, seconds FROM jobs") == [
        (1, "thr_1:toolu_2", "backfill", 20)
    ]


async def test_the_poller_reports_done_once_the_time_is_up(demo, clock) -> None:
    wait = await demo.run_job(demo.RunJobArgs(name="backfill", seconds=20), ctx())
    clock.advance(19)
    assert await demo.run_job.poll(wait.data, ctx()) is None
    # Another process polls it: nothing but the table and the wait's data carry over.
    await demo.dispose_demo_engines()
    clock.advance(1)
    done = await demo.run_job.poll(wait.data, ctx())
    assert done == {"job": "backfill", "status": "succeeded", "ran_for_s": 20}


async def test_the_wait_reads_after_waiting_for(demo) -> None:
    """Issue 15 §12: the status line, "⏳ Waiting for " and the description, said
    "Waiting for job: job backfill (20 s)"."""
    wait = await demo.run_job(demo.RunJobArgs(name="backfill", seconds=20), ctx())
    assert wait.description == "the backfill job to run for 20 s"


async def test_a_short_job_polls_as_often_as_it_lasts(demo) -> None:
    wait = await demo.run_job(demo.RunJobArgs(name="tick", seconds=1), ctx())
    assert (wait.timeout_s, wait.poll_every_s) == (33, 1.0)
    with pytest.raises(ValueError):
        demo.RunJobArgs(name="long", seconds=601)


async def test_polling_a_job_missing_from_the_table_ends_the_wait(demo) -> None:
    await demo.run_job(demo.RunJobArgs(name="x", seconds=1), ctx())  # creates the table
    lost = await demo.run_job.poll({"job_id": 99}, ctx())
    assert lost is not None and lost["status"] == "lost"


# --- check_health and registration ------------------------------------------------------


async def test_check_health_fails_on_the_first_attempt_only(demo) -> None:
    args = demo.CheckHealthArgs(service="api")
    with pytest.raises(RetryableToolError, match="health endpoint timed out"):
        await demo.check_health(args, ctx(attempt=1))
    out = await demo.check_health(args, ctx(attempt=2))
    assert (out["service"], out["status"], out["attempt"]) == ("api", "healthy", 2)


def test_importing_registers_the_tools_and_the_helper_forgets_them() -> None:
    was_loaded = MODULE in sys.modules
    with demo_loaded() as demo:
        policies = {n: REGISTRY.get(n).policy for n in ("deploy", "run_job", "check_health")}
        assert policies == {
            "deploy": "approve_before_run",
            "run_job": "wait_for_external_event",
            "check_health": "run_now",
        }
        assert demo.run_job.poll is not None
        assert all("Returns" in REGISTRY.get(n).description for n in policies)
    if not was_loaded:
        assert "deploy" not in REGISTRY and MODULE not in sys.modules
