"""``opsloop local`` as a real process: no Slack settings, one URL to open, a clean stop.

Without ANTHROPIC_API_KEY it runs the offline phrasebook model and the demo tools (the
defaults); with a key, Claude (here the fake Messages API, through ANTHROPIC_BASE_URL).
Nothing reaches the network: the process talks to itself and to the fakes on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_cli import ROOT, _free_port, fakes_in_a_thread

ALICE, BOB = "U0ALICE", "U0BOB"
OPS = "C0OPS"


def _needs_the_offline_model() -> None:
    # Looked up, not imported: importing tools.demo here would register its tools in
    # this test process's registry, which other tests share.
    for module in ("engine.models.phrasebook", "tools.demo"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not there yet")


def local_env(tmp_path: Path, port: int, **extra: str) -> dict[str, str]:
    """The environment of a fresh shell: no Slack, no Anthropic, no opsloop settings.

    The sweep runs at start only: a stop while a sweep reads the database makes
    APScheduler cancel it mid-query and log the traceback (an engine issue, reported);
    inputs kick the worker anyway."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLACK_", "DATABASE_URL", "OPSLOOP_", "PORT", "ANTHROPIC_"))
    }
    env.update(
        PYTHONPATH=str(ROOT),
        DATABASE_URL=f"sqlite:///{tmp_path / 'local.db'}",
        PORT=str(port),
        OPSLOOP_SWEEP_SECONDS="60",
    )
    env.update(extra)
    return env


class Running:
    def __init__(self, proc: subprocess.Popen[str], lines: queue.Queue[str], err: Path) -> None:
        self.proc = proc
        self.lines = lines
        self.err = err
        self.url = ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def first_line(self, within: float = 60) -> str:
        try:
            return self.lines.get(timeout=within)
        except queue.Empty:
            raise AssertionError(f"no line on stdout; stderr:\n{self.stderr()[-3000:]}") from None

    def stop(self, sig: int = signal.SIGTERM, within: float = 30) -> int:
        time.sleep(0.5)  # the sweep made at start is over (see local_env)
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=within)


@contextlib.contextmanager
def opsloop_local(tmp_path: Path, env: dict[str, str], name: str = "local") -> Iterator[Running]:
    err = tmp_path / f"{name}.stderr"
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "local"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    running = Running(proc, lines, err)
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            raw, status, kind = resp.read(), resp.status, resp.headers.get_content_type()
    except urllib.error.HTTPError as exc:
        raw, status, kind = exc.read(), exc.code, exc.headers.get_content_type()
    return status, json.loads(raw) if kind == "application/json" else raw.decode()


def wait_for(
    fetch: Callable[[], Any], check: Callable[[Any], Any], proc: Running, within: float = 60
) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = fetch()
        if check(value):
            return value
        assert proc.proc.poll() is None, proc.stderr()[-3000:]
        assert time.monotonic() < deadline, f"never true; last: {json.dumps(value)[-2000:]}"
        time.sleep(0.1)


def thread_of(url: str, root: str, user: str = ALICE) -> dict[str, Any]:
    status, data = http("GET", f"{url}ui/channels/{OPS}/threads/{root}?user={user}")
    assert status == 200, data
    return data


def shown(thread: dict[str, Any]) -> str:
    return json.dumps([m.get("blocks") or m.get("text") for m in thread["replies"]])


def assert_clean_stop(running: Running, code: int) -> None:
    err = running.stderr()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err
    for line in err.splitlines():
        assert line.startswith("time=") and " level=" in line and " msg=" in line, line
    assert any("msg=stopped" in line for line in err.splitlines())


# --- starting and stopping -----------------------------------------------------------------


@pytest.mark.slow
def test_local_needs_no_slack_prints_its_url_serves_the_page_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    _needs_the_offline_model()
    port = _free_port()
    with opsloop_local(tmp_path, local_env(tmp_path, port)) as running:
        url = f"http://127.0.0.1:{port}/"
        assert running.first_line() == f"opsloop local: open {url}"
        status, page = http("GET", url)
        assert status == 200 and 'data-testid="composer-input"' in page
        status, info = http("GET", f"{url}ui/workspace?user={ALICE}")
        assert status == 200
        assert info["model"]["kind"] == "offline" and info["model"]["name"] == "offline phrasebook"
        assert info["model"]["suggestions"] and all(
            s["phrase"] and s["does"] for s in info["model"]["suggestions"]
        )
        assert http("GET", f"{url}healthz") == (200, {"status": "ok"})

        status, posted = http(
            "POST", f"{url}ui/messages", {"user": ALICE, "channel": OPS, "text": "@opsloop help"}
        )
        assert status == 201, posted
        root = posted["message"]["ts"]
        # The phrasebook's help lists what it understands.
        wait_for(
            lambda: thread_of(url, root), lambda t: "deploy api to staging" in shown(t), running
        )
        code = running.stop(signal.SIGTERM)
    assert_clean_stop(running, code)
    saved = json.loads((tmp_path / "local.local.json").read_text())  # beside the database
    assert root in json.dumps(saved["messages"])


@pytest.mark.slow
def test_ctrl_c_stops_it_cleanly(tmp_path: Path) -> None:
    _needs_the_offline_model()
    port = _free_port()
    with opsloop_local(tmp_path, local_env(tmp_path, port)) as running:
        assert running.first_line().startswith("opsloop local: open http://127.0.0.1:")
        code = running.stop(signal.SIGINT)
    assert_clean_stop(running, code)


def test_a_busy_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "bot.cli", "local"],
            cwd=tmp_path,
            env=local_env(tmp_path, port),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"opsloop local: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(set PORT to another port)"
    ]
    assert not (tmp_path / "local.db").exists()  # nothing started


def test_a_bad_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = local_env(tmp_path, 0)
    env["PORT"] = "web"
    proc = subprocess.run(
        [sys.executable, "-m", "bot.cli", "local"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == ["opsloop: PORT must be a number, not 'web'"]


# --- a whole story, across a crash ------------------------------------------------------------


@pytest.mark.slow
def test_a_deploy_awaiting_approval_survives_a_kill_and_finishes_after_the_restart(
    tmp_path: Path,
) -> None:
    """The offline model and the demo tools: a deploy card, SIGKILL, a new process shows
    the same thread, and bob approves the card the dead process posted."""
    _needs_the_offline_model()
    port = _free_port()
    env = local_env(tmp_path, port)
    with opsloop_local(tmp_path, env, "first") as first:
        url = first.first_line().removeprefix("opsloop local: open ")
        status, posted = http(
            "POST",
            f"{url}ui/messages",
            {"user": ALICE, "channel": OPS, "text": "@opsloop deploy api to staging"},
        )
        assert status == 201, posted
        root = posted["message"]["ts"]
        thread = wait_for(
            lambda: thread_of(url, root), lambda t: "opsloop_approve" in shown(t), first
        )
        first.proc.kill()  # no goodbye: the workspace file must already hold the card
        first.proc.wait(timeout=30)

    with opsloop_local(tmp_path, env, "second") as second:
        assert second.first_line() == f"opsloop local: open {url}"
        again = thread_of(url, root, BOB)
        assert [m["ts"] for m in again["replies"]] == [m["ts"] for m in thread["replies"]]
        card = next(m for m in again["replies"] if "opsloop_approve" in json.dumps(m))
        status, clicked = http(
            "POST",
            f"{url}ui/actions",
            {"user": BOB, "channel": OPS, "message_ts": card["ts"], "action_id": "opsloop_approve"},
        )
        assert (status, clicked) == (200, {"ok": True, "status": 200})
        done = wait_for(
            lambda: thread_of(url, root),
            lambda t: "Approved by" in shown(t) and "idle" in trace_status(url, root),
            second,
        )
        assert "staging" in shown(done)
        status, trace = http("GET", f"{url}ui/trace?channel={OPS}&ts={root}")
        types = [e["type"] for e in trace["events"]]
        assert types.count("tool_started") == 1 and types.count("approval_granted") == 1
        code = second.stop()
    assert_clean_stop(second, code)


def trace_status(url: str, root: str) -> str:
    status, trace = http("GET", f"{url}ui/trace?channel={OPS}&ts={root}")
    return trace["thread"]["status"] if status == 200 else ""


# --- with Claude --------------------------------------------------------------------------------


@pytest.mark.slow
def test_with_an_anthropic_key_it_runs_claude(tmp_path: Path) -> None:
    port = _free_port()
    with fakes_in_a_thread() as (claude, _slack):
        claude.text("Hello from Claude.")
        env = local_env(
            tmp_path,
            port,
            ANTHROPIC_API_KEY="test-key",
            ANTHROPIC_BASE_URL=claude.url,
            OPSLOOP_TOOLS="tools.builtin",
        )
        with opsloop_local(tmp_path, env) as running:
            url = running.first_line().removeprefix("opsloop local: open ")
            _, info = http("GET", f"{url}ui/workspace")
            assert (info["model"]["kind"], info["model"]["suggestions"]) == ("claude", [])
            assert info["model"]["name"].startswith("claude-")
            status, posted = http(
                "POST", f"{url}ui/messages", {"user": ALICE, "channel": OPS, "text": "@opsloop hi"}
            )
            assert status == 201
            root = posted["message"]["ts"]
            wait_for(
                lambda: thread_of(url, root), lambda t: "Hello from Claude." in shown(t), running
            )
            code = running.stop()
        claude.assert_clean()
    assert_clean_stop(running, code)
