"""MCP servers as `opsloop serve` runs them (issue 16 §1, §9): one that cannot start never
stops the bot, they start together, and what the running bot offers is what
``GET /tools``, ``/metrics`` and ``opsloop tools --from-server`` report."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from bot.runtime import Runtime, start_runtime, web_app
from engine.config_file import parse_config
from tests.bot.test_cli import _free_port, fakes_in_a_thread, run_cli
from tests.bot.test_runtime import MCP_SERVER, settings_for
from tests.bot.test_serve_crash import _wait_healthy, serve
from tests.fakes.slack import SIGNING_SECRET, TOKEN
from tools import ToolContext

pytestmark = pytest.mark.slow


def mcp_up(text: str) -> dict[str, float]:
    """``opsloop_mcp_server_up`` by server, from a scrape."""
    return {
        s.labels["server"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "opsloop_mcp_server_up"
    }


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
        return resp.read().decode()


def test_serve_starts_without_the_servers_that_cannot_and_takes_one_when_it_comes_up(
    tmp_path: Path,
) -> None:
    """A missing command and a server that exits: serve is healthy anyway, one warning
    line each, /metrics shows them down; the one that comes up later is offered."""
    gate = tmp_path / "late-may-start"
    config = tmp_path / "opsloop.yaml"
    config.write_text(
        f"""
tools:
  mcp:
    demo:
      command: {sys.executable}
      args: [{MCP_SERVER}, stdio]
      tools: [echo]
    missing:
      command: {tmp_path / "no-such-server"}
    exits:
      command: {sys.executable}
      args: ["-c", "import sys; sys.exit(3)"]
    late:
      command: {sys.executable}
      args: [{MCP_SERVER}, stdio, --unless, {gate}]
      tools: [echo]
"""
    )
    port = _free_port()
    with fakes_in_a_thread() as (claude, slack):
        proc = serve(
            f"sqlite:///{tmp_path / 'serve.db'}",
            claude.url,
            slack.url,
            None,
            port=port,
            OPSLOOP_CONFIG=str(config),
        )
        try:
            _wait_healthy(proc, port)
            assert mcp_up(get(port, "/metrics")) == {
                "demo": 1,
                "missing": 0,
                "exits": 0,
                "late": 0,
            }
            offered = {t["name"] for t in json.loads(get(port, "/tools"))["tools"]}
            assert "mcp__demo__echo" in offered and "mcp__late__echo" not in offered
            gate.touch()
            deadline = time.monotonic() + 60  # retried after 1, 2, 4… s
            while mcp_up(get(port, "/metrics"))["late"] != 1:
                assert proc.poll() is None, proc.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "the late server was never taken"
                time.sleep(0.1)
            offered = {t["name"] for t in json.loads(get(port, "/tools"))["tools"]}
            assert "mcp__late__echo" in offered
            assert mcp_up(get(port, "/metrics"))["missing"] == 0
            # What the running bot offers, as the command line reads it.
            listed = run_cli(
                "tools",
                "--json",
                "--from-server",
                f"http://127.0.0.1:{port}",
                db=None,
                cwd=tmp_path,
            )
            assert listed.returncode == 0, listed.stderr
            rows = {
                json.loads(line)["name"]: json.loads(line) for line in listed.stdout.splitlines()
            }
            assert rows["mcp__demo__echo"] == {
                "name": "mcp__demo__echo",
                "source": "mcp:demo",
                "policy": "approve_before_run",
                "idempotent": False,
                "drift": False,
            }
            assert "MCP server 'missing' is down (" in listed.stderr
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    down = [line for line in err.splitlines() if "mcp server down" in line]
    for server in ("missing", "exits", "late"):  # one line each, however often retried
        assert len([line for line in down if f"server={server} " in line]) == 1, down
    assert not [line for line in down if "server=demo " in line]
    assert "Traceback" not in err


def waiting_pair(tmp_path: Path) -> str:
    """Two servers that each wait for the other to start before they answer."""
    a, b = tmp_path / "a.started", tmp_path / "b.started"
    return f"""
tools:
  mcp:
    first:
      command: {sys.executable}
      args: [{MCP_SERVER}, stdio, --mark, {a}, --await, {b}]
      tools: [echo]
    second:
      command: {sys.executable}
      args: [{MCP_SERVER}, stdio, --mark, {b}, --await, {a}]
      tools: [echo, redefine]
"""


async def test_servers_are_connected_together(db_url, fakes, tmp_path: Path) -> None:
    """One after the other, the first would wait for the second forever (and be left
    out at its connect time); together, both answer."""
    config = parse_config(waiting_pair(tmp_path), {})
    settings = settings_for(db_url, fakes, tmp_path)
    rt = await start_runtime(settings, token=TOKEN, signing_secret=SIGNING_SECRET, config=config)
    try:
        assert {"mcp__first__echo", "mcp__second__echo"} <= set(rt.tools.names())
        assert [s.up for s in rt.mcp_servers] == [True, True]
    finally:
        await rt.close(5)


async def redefine(rt: Runtime, tool: str, description: str) -> None:
    """Have the server change a definition, saying nothing of it."""
    change = rt.tools.get("mcp__second__redefine")
    assert change is not None
    args = change.parse_arguments({"tool": tool, "description": description})
    await rt.thread.run(change.run(args, ToolContext("t", "c", "k", 1)))


async def test_get_tools_and_metrics_report_what_the_running_bot_offers(
    db_url, fakes, tmp_path: Path
) -> None:
    config = parse_config(waiting_pair(tmp_path), {})
    settings = settings_for(db_url, fakes, tmp_path)
    rt = await start_runtime(settings, token=TOKEN, signing_secret=SIGNING_SECRET, config=config)
    try:
        async with TestClient(TestServer(web_app(rt))) as client:
            before = await (await client.get("/tools")).json()
            echo = {t["name"]: t for t in before["tools"]}["mcp__second__echo"]
            assert echo["drift"] is False and echo["source"] == "mcp:second"
            await redefine(rt, "echo", "Echo the text, and keep a copy.")
            # Asking lists the servers first: the silent change is found, and taken.
            after = await (await client.get("/tools")).json()
            echo = {t["name"]: t for t in after["tools"]}["mcp__second__echo"]
            assert echo["drift"] is True
            assert rt.tools.get("mcp__second__echo").description == (  # type: ignore[union-attr]
                "Echo the text, and keep a copy."
            )
            assert {"server": "second", "up": True, "tools": 2} == {
                k: v for k, v in after["servers"][1].items() if k != "redefined"
            }
            assert after["servers"][1]["redefined"] == ["mcp__second__echo"]
            scrape = await (await client.get("/metrics")).text()
            samples = {
                (s.name, s.labels.get("server")): s.value
                for family in text_string_to_metric_families(scrape)
                for s in family.samples
                if s.name.startswith("opsloop_mcp_")
            }
            assert samples == {
                ("opsloop_mcp_server_up", "first"): 1,
                ("opsloop_mcp_server_up", "second"): 1,
                ("opsloop_mcp_tools", "first"): 1,
                ("opsloop_mcp_tools", "second"): 2,
                ("opsloop_mcp_tools_redefined", "first"): 0,
                ("opsloop_mcp_tools_redefined", "second"): 1,
            }
            url = str(client.make_url("/")).rstrip("/")
            table = await asyncio.to_thread(
                run_cli, "tools", "--from-server", url, db=None, cwd=tmp_path
            )
        assert table.returncode == 0, table.stderr
        row = next(r for r in table.stdout.splitlines() if r.startswith("mcp__second__echo "))
        assert row.split() == [
            "mcp__second__echo",
            "mcp:second",
            "approve_before_run",
            "-",
            "no",
            "DRIFTED",
        ]
    finally:
        await rt.close(5)


def test_tools_from_a_server_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    proc = run_cli("tools", "--from-server", url, db=None, cwd=tmp_path)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"opsloop tools: cannot read {url}/tools: ")
