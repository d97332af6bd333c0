"""MCP log lines name the thread whose call they are about, or none (issue 15 §4).

The connection's worker outlives the call that opened it; its lines must not carry that
call's thread. Two threads, run by the real runner, each call a real stdio MCP server
that ends its process in the middle of the call.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from engine.inputs import Decider, decide_approval, decide_reconcile, post_user_message
from engine.logs import JsonFormatter
from engine.models.scripted import call, say
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.state import ThreadState
from engine.store import Store, ThreadKey, open_store
from tests.support.fakes import RecordingModel
from tools import ToolRegistry
from tools.mcp import McpServerConfig, McpSource

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).resolve().parents[1] / "support" / "mcp_servers.py")
CALL_LINES = ("mcp connection lost", "mcp call outcome unknown")
OPEN = ReviewerRule()


class Lines:
    """JSON log lines of tools.mcp, formatted as they are emitted (in the logging task)."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()
        self.read = 0

    def since_last(self) -> list[dict[str, str]]:
        text = self.buffer.getvalue()
        new, self.read = text[self.read :], len(text)
        return [json.loads(line) for line in new.splitlines()]


@pytest.fixture
def lines() -> Iterator[Lines]:
    captured = Lines()
    handler = logging.StreamHandler(captured.buffer)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tools.mcp")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    yield captured
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.fixture
async def sqlite_store(sqlite_url: str) -> AsyncIterator[Store]:
    store = await open_store(sqlite_url)
    yield store
    await store.close()


@pytest.fixture
async def source() -> AsyncIterator[McpSource]:
    src = McpSource("demo", McpServerConfig(command=sys.executable, args=[SCRIPT, "stdio"]))
    yield src
    await src.close()


def assert_named(found: list[dict[str, str]], thread_id: str) -> None:
    """Each line about the call names its thread; the others name none."""
    about_call = [line for line in found if line["msg"].startswith(CALL_LINES)]
    assert any(line["msg"].startswith("mcp call outcome unknown") for line in about_call), found
    for line in found:
        expected = thread_id if line in about_call else None
        assert line.get("thread_id") == expected, line


async def test_each_crash_is_logged_under_the_thread_whose_call_it_was(
    sqlite_store: Store, source: McpSource, lines: Lines
):
    store = sqlite_store
    registry = ToolRegistry()
    for tool in await source.open():  # at startup: no thread bound
        registry.register(tool)
    script = [call("mcp__demo__crash"), call("mcp__demo__echo", text="hi"), say("noted")]
    runner = Runner(store, RecordingModel(script), registry)

    async def approve_and_run(tid: str, cid: str) -> ThreadState:
        await decide_approval(
            store, tid, tool_call_id=cid, decider=Decider("U_BOB"), decision="approve",
            reviewers=OPEN,
        )  # fmt: skip
        state = await runner.run(tid)
        assert state is not None
        return state

    async def crash_in_a_new_thread(ts: str) -> tuple[str, str]:
        key = ThreadKey("T1", "C1", ts)
        posted = await post_user_message(store, key, text="go", user="U_ALICE", dedupe_key=ts)
        state = await runner.run(posted.thread_id)
        assert state is not None and state.pending is not None, state
        cid = state.pending.tool_call_id
        state = await approve_and_run(posted.thread_id, cid)
        assert state.status == "awaiting_reconcile", state
        return posted.thread_id, cid

    # The first crash: the session was opened at startup, outside any thread.
    first, cid = await crash_in_a_new_thread("1700000000.000100")
    assert_named(lines.since_last(), first)
    # It did not happen; the first thread's next call opens the next session.
    await decide_reconcile(
        store, first, tool_call_id=cid, decider=Decider("U_BOB"), decision="abandon",
        reviewers=OPEN,
    )  # fmt: skip
    state = await runner.run(first)
    assert state is not None and state.pending is not None, state
    state = await approve_and_run(first, state.pending.tool_call_id)
    assert state.status == "idle", state
    lines.since_last()
    # The second thread's crash, on the session the first thread's call opened.
    second, _ = await crash_in_a_new_thread("1700000000.000200")
    assert second != first
    assert_named(lines.since_last(), second)
