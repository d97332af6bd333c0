"""The thread as a live plan in local mode, in a real browser (issue 22).

alice asks ``look into api``: three read-only calls (the catalog, a health check the
engine retries once, who is on call) in one run, shown as ONE plan message whose task
cards go from in progress to complete, with the loading status and the agent session
(and its stop button) under the thread while it works, the answer streamed into the
same message and the 👍 / 👎 row under it; her 👍 is in the thread's trace. Then the
same with ``… and simulate a crash``: the health check SIGKILLs opsloop mid-run, a new
process on the same database and port resumes, and the page (reconnected on its own)
shows the run finished in the same plan message, its cards as the log says.

To look at the page while a call runs, the test holds the catalog MCP server (the first
call) with SIGSTOP until it has seen what it needs, then lets it go: no timing involved.
A MutationObserver keeps every status each card showed, so the order is checked too.

``OPSLOOP_SCREENSHOT_DIR=docs`` writes the README's plan screenshot there
(``docs/local-plan.png``); otherwise it goes to the test's temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_local_cli import Running, http, opsloop_local
from tests.e2e.conftest import OPS, WAIT_MS, local_settings, open_page, started
from tests.e2e.test_browser import ask

pytestmark = pytest.mark.slow

RESUME_MS = 120_000  # a restart, its first sweep and the rest of the run, under load
STATUS_ORDER = ("pending", "in_progress", "complete")
CATALOG = "tools.demo_mcp"  # the MCP server local mode starts (localslack/opsloop.yaml)
SHOT = {"width": 1400, "height": 1040}  # the README's docs/local-plan.png

# Records what the page showed: each task card's statuses, the loading status's text and
# the agent session's state, each time it changed.
WATCH = """() => {
  const seen = (window.__seen = { tasks: {}, status: [], session: [] });
  const note = (list, value) => { if (list[list.length - 1] !== value) list.push(value); };
  const look = () => {
    const pane = document.querySelector('[data-testid="thread-pane"]');
    for (const card of pane.querySelectorAll('[data-testid="task-card"]')) {
      note((seen.tasks[card.dataset.taskId] ||= []), card.dataset.status);
    }
    const status = document.querySelector('[data-testid="agent-status"]');
    note(seen.status, status && status.checkVisibility() ? status.innerText : "");
    const session = document.querySelector('[data-testid="agent-session"]');
    note(seen.session, session && session.checkVisibility() ? session.dataset.state : "");
  };
  new MutationObserver(look).observe(document.body, {
    subtree: true, childList: true, attributes: true, characterData: true,
  });
  look();
}"""


def watch(page) -> None:
    page.evaluate(WATCH)


def seen(page) -> dict[str, Any]:
    return page.evaluate("() => window.__seen")


def catalog_pid(running: Running, within: float = 60) -> int:
    """The catalog MCP server's pid: the child of ``running`` that runs ``CATALOG``."""
    deadline = time.monotonic() + within
    while True:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile, or not ours to read
            if parent == running.proc.pid and CATALOG.encode() in command:
                return int(entry.name)
        assert running.proc.poll() is None, running.stderr()[-3000:]
        assert time.monotonic() < deadline, "local mode started no catalog MCP server"
        time.sleep(0.1)


@contextlib.contextmanager
def catalog_held(running: Running) -> Iterator[None]:
    """The catalog MCP server stopped (SIGSTOP) until the block ends: a call to it runs
    until then, as a slow server's would."""
    pid = catalog_pid(running)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def plan_message(pane, page) -> Any:
    """The bot's message in the thread that holds a plan."""
    return pane.locator('[data-testid="message"][data-bot="true"]').filter(
        has=page.get_by_test_id("plan")
    )


def first_card_runs(page, pane) -> str:
    """While the catalog is held: the plan message with its first card in progress, the
    loading status naming the call, the session processing with its stop button.
    Returns the plan message's ts."""
    plan = plan_message(pane, page)
    running = plan.locator('[data-testid="task-card"][data-status="in_progress"]')
    running.wait_for()
    assert "api" in running.get_by_test_id("task-details").inner_text()
    assert plan.get_by_test_id("stream-state").inner_text() == "streaming…"
    status = page.get_by_test_id("agent-status").filter(has_text="is running")
    status.wait_for()
    assert "opsloop is running" in status.inner_text() and "api" in status.inner_text()
    page.locator('[data-testid="agent-session"][data-state="processing"]').wait_for()
    assert page.get_by_test_id("agent-stop").is_visible()
    assert plan.count() == 1
    ts = plan.get_attribute("data-ts")
    assert ts
    return ts


def finished(page, pane, ts: str, within: float = WAIT_MS) -> Any:
    """The plan message ``ts`` once stopped with its feedback row; the thread at rest."""
    plan = pane.locator(f'[data-testid="message"][data-ts="{ts}"]')
    plan.get_by_test_id("feedback-button").first.wait_for(timeout=within)
    page.locator('[data-testid="agent-session"][data-state="active"]').wait_for(timeout=within)
    page.get_by_test_id("agent-status").wait_for(state="hidden")
    assert not page.get_by_test_id("agent-stop").is_visible()
    return plan


def trace_of(url: str, root: str) -> list[dict[str, Any]]:
    """The thread's log, as the page's trace panel reads it."""
    status, trace = http("GET", f"{url}ui/trace?channel={OPS}&ts={root}")
    assert status == 200, trace
    return trace["events"]


def assert_cards_match_the_log(plan, events: list[dict[str, Any]]) -> None:
    """One card per call of the run, in the log's order, each complete with its
    arguments (details) and its result (output)."""
    calls = [e["tool_call_id"] for e in events if e["type"] == "tool_call_requested"]
    ok = {e["tool_call_id"] for e in events if e["type"] == "tool_result" and e["ok"]}
    cards = plan.get_by_test_id("task-card")
    ids = [cards.nth(i).get_attribute("data-task-id") for i in range(cards.count())]
    assert ids == calls and len(calls) == 3 and ok == set(calls), (ids, calls)
    assert [cards.nth(i).get_attribute("data-status") for i in range(3)] == ["complete"] * 3
    outputs = [cards.nth(i).get_by_test_id("task-output").inner_text() for i in range(3)]
    assert "platform" in outputs[0] and "healthy" in outputs[1] and "Bob Chen" in outputs[2]
    for card in (cards.nth(0), cards.nth(1)):
        assert "api" in card.get_by_test_id("task-details").inner_text()


def assert_statuses_went_forward(history: dict[str, list[str]], ids: list[str]) -> None:
    """Every card's statuses came in order (pending, in progress, complete), each
    ended complete, and the first (held) was seen in progress."""
    for task_id in ids:
        shown = history[task_id]
        ranks = [STATUS_ORDER.index(s) for s in shown]
        assert ranks == sorted(ranks) and shown[-1] == "complete", (task_id, shown)
    assert "in_progress" in history[ids[0]], history


def root_ts(pane) -> str:
    ts = pane.get_attribute("data-thread-ts")
    assert ts
    return ts


def test_three_tools_and_an_answer_are_one_plan_message_with_feedback(
    page, local: Running, tmp_path: Path
) -> None:
    watch(page)
    with catalog_held(local):
        pane = ask(page, "look into api")
        ts = first_card_runs(page, pane)
    plan = finished(page, pane, ts)

    events = trace_of(local.url, root_ts(pane))
    assert_cards_match_the_log(plan, events)
    cards = plan.get_by_test_id("task-card")
    ids = [cards.nth(i).get_attribute("data-task-id") or "" for i in range(3)]
    history = seen(page)
    assert_statuses_went_forward(history["tasks"], ids)
    sessions = history["session"]
    assert "processing" in sessions and sessions[-1] == "active", sessions
    assert sessions.index("processing") < len(sessions) - 1
    assert any("is running" in s for s in history["status"]) and history["status"][-1] == ""

    # The answer is streamed into the plan message, not posted apart: one plan, one answer.
    text = plan.get_by_test_id("message-text").inner_text()
    assert "What I found about api" in text and "api is healthy" in text
    answers = pane.locator('[data-testid="message"]').filter(has_text="What I found about api")
    assert answers.count() == 1 and pane.get_by_test_id("plan").count() == 1
    streams = [e for e in events if e["type"] == "message_posted" and e.get("kind") == "stream"]
    assert [e["ts"] for e in streams] == [ts]

    up = plan.locator('[data-testid="feedback-button"][data-value="positive"]')
    up.click()
    plan.locator('[data-testid="feedback-button"][aria-pressed="true"]').wait_for()
    assert up.get_attribute("aria-pressed") == "true"
    shots = Path(os.environ.get("OPSLOOP_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(SHOT)  # the whole thread, from the request to the 👍 row
    pane.get_by_test_id("message").first.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "local-plan.png"))

    # The click is recorded before the page hears back: the trace shows it.
    pane.get_by_test_id("trace-toggle").click()
    trace = page.get_by_test_id("trace-panel")
    given = trace.locator('[data-testid="trace-event"][data-type="feedback_given"]')
    given.wait_for()
    assert given.count() == 1
    assert given.get_by_test_id("trace-actor").inner_text() == "@alice"
    assert "👍 (up)" in given.get_by_test_id("trace-summary").inner_text()
    assert f"on {ts}" in given.get_by_test_id("trace-summary").inner_text()


def test_the_stop_button_ends_the_run_after_the_running_call_and_the_plan_says_who(
    page, local: Running
) -> None:
    """Slack's stop button while the first call runs: the call ends by its normal path,
    nothing more is called, and the plan message says alice stopped it."""
    with catalog_held(local):
        pane = ask(page, "look into api")
        ts = first_card_runs(page, pane)
        page.get_by_test_id("agent-stop").click()
        # Slack stops the app's stream at once; the app hears who pressed it.
        plan = pane.locator(f'[data-testid="message"][data-ts="{ts}"]')
        pane.locator(f'[data-ts="{ts}"][data-stream="stopped_by_user"]').wait_for()
        assert plan.get_by_test_id("stream-state").inner_text() == "stopped"
    stopped = plan.locator(".md-mention", has_text="@alice")
    stopped.wait_for()
    assert "Stopped by @alice" in plan.get_by_test_id("message-text").inner_text()
    page.locator('[data-testid="agent-session"]:not([data-state="processing"])').wait_for()
    assert not page.get_by_test_id("agent-stop").is_visible()
    cards = plan.get_by_test_id("task-card")
    assert cards.count() == 1 and cards.first.get_attribute("data-status") == "complete"
    events = trace_of(local.url, root_ts(pane))
    types = [e["type"] for e in events]
    assert types.count("stop_requested") == 1 and types.count("tool_call_requested") == 1
    assert "final_answer" not in types


def test_a_crash_mid_run_resumes_into_the_same_plan_message(browser, tmp_path: Path) -> None:
    env = local_settings(tmp_path)
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(opsloop_local(tmp_path, env, "first"))
        url = started(first)
        page = stack.enter_context(open_page(browser, url))
        watch(page)
        with catalog_held(first):
            pane = ask(page, "look into api and simulate a crash")
            ts = first_card_runs(page, pane)
        # The catalog answers; the health check, next, kills opsloop in its first attempt.
        assert first.proc.wait(timeout=RESUME_MS / 1000) == -signal.SIGKILL
        page.locator('[data-testid="connection-status"]:not([data-state="live"])').wait_for()

        second = stack.enter_context(opsloop_local(tmp_path, env, "second"))
        assert started(second) == url  # same port, database and workspace file
        page.locator('[data-testid="connection-status"][data-state="live"]').wait_for(
            timeout=RESUME_MS
        )
        plan = finished(page, pane, ts, within=RESUME_MS)

        # Still one plan message, the one started before the crash, finished in place.
        assert pane.get_by_test_id("plan").count() == 1
        assert plan_message(pane, page).get_attribute("data-ts") == ts
        events = trace_of(url, root_ts(pane))
        assert_cards_match_the_log(plan, events)
        streams = [e for e in events if e["type"] == "message_posted" and e.get("kind") == "stream"]
        assert [e["ts"] for e in streams] == [ts]
        health = [e["tool_call_id"] for e in events if e["type"] == "tool_call_requested"][1]
        attempts = [
            e["attempt"]
            for e in events
            if e["type"] == "tool_started" and e["tool_call_id"] == health
        ]
        assert attempts == [1, 2]  # cut off by the crash, run again by the new process
        text = plan.get_by_test_id("message-text").inner_text()
        assert "opsloop was killed during the first" in text
        cards = plan.get_by_test_id("task-card")
        ids = [cards.nth(i).get_attribute("data-task-id") or "" for i in range(3)]
        assert_statuses_went_forward(seen(page)["tasks"], ids)
        assert second.stop() == 0, second.stderr()[-3000:]
