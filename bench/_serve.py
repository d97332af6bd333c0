"""Real ``opsloop serve`` processes for the benches: start, wait healthy, SIGKILL, stop.

A :class:`Replica` is one ``python -m bot.cli serve`` on a free 127.0.0.1 port, with the
environment of ``serve_env`` (fake Slack and Anthropic URLs, a database, a signing and a
webhook secret) and its log in a file, so a failure can show the tail. ``post_slack``
sends a payload signed as Slack signs it; ``post_hook`` a webhook signed as
``bot/hooks.py`` checks it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.slack_ack import free_port, log
from bot.hooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature
from tests.fakes.anthropic import FAKE_API_KEY
from tests.fakes.slack import TOKEN, signed

ROOT = Path(__file__).resolve().parents[1]
SIGNING_SECRET = "bench-signing-secret"
WEBHOOK_SECRET = "bench-webhook-secret"


def serve_env(db_url: str, slack_url: str, claude_url: str, **extra: str) -> dict[str, str]:
    """The process environment: ours without any opsloop, Slack or Anthropic setting,
    then the bench's. Every ``OPSLOOP_*`` tuning (lease, sweep) keeps its default."""
    prefixes = ("SLACK_", "OPSLOOP_", "ANTHROPIC_", "DATABASE_URL", "PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(
        PYTHONPATH=str(ROOT),
        DATABASE_URL=db_url,
        SLACK_BOT_TOKEN=TOKEN,
        SLACK_SIGNING_SECRET=SIGNING_SECRET,
        SLACK_API_URL=slack_url,
        ANTHROPIC_API_KEY=FAKE_API_KEY,
        ANTHROPIC_BASE_URL=claude_url,
        OPSLOOP_WEBHOOK_SECRET=WEBHOOK_SECRET,
        OPSLOOP_HOST="127.0.0.1",
        **extra,
    )
    return env


class Replica:
    """One ``opsloop serve`` process; ``base`` is its URL once started."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.base = ""
        self.healthy_at = 0.0  # time.time() of the first 200 from /healthz

    async def start(self, within: float = 60) -> Replica:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        with self.log_path.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bot.cli",
                "serve",
                env={**self.env, "PORT": str(port)},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=out,
            )
        await self._wait_healthy(within)
        log(f"{self.name} healthy on {self.base} (pid {self.proc.pid})")
        return self

    async def _wait_healthy(self, within: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + within
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.proc.returncode is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode}{self.tail()}"
                    )
                try:
                    async with http.get(f"{self.base}/healthz") as resp:
                        if resp.status == 200:
                            self.healthy_at = time.time()
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.02)  # the SIGKILL figure starts here: poll finely
        raise RuntimeError(f"{self.name} did not become healthy{self.tail()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no lease release; what it held is left as a crash leaves it."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def stop(self, grace: float = 30) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                async with asyncio.timeout(grace):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
        await self.proc.wait()

    def tail(self, chars: int = 2000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return f"; its log ends:\n{text[-chars:]}" if text else ""


async def post_slack(
    http: aiohttp.ClientSession, replica: Replica, payload: dict[str, Any]
) -> None:
    """Send ``payload`` to ``/slack/events`` as Slack would; anything but 200 is an error."""
    body, headers = signed(payload, SIGNING_SECRET)
    async with http.post(f"{replica.base}/slack/events", data=body, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{replica.name} answered {resp.status} to a Slack request")


async def post_hook(
    http: aiohttp.ClientSession, replica: Replica, wait_id: str, result: dict[str, Any]
) -> None:
    body = json.dumps(result).encode()
    stamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: stamp,
        SIGNATURE_HEADER: signature(WEBHOOK_SECRET, stamp, wait_id, body),
    }
    async with http.post(f"{replica.base}/hooks/{wait_id}", data=body, headers=headers) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"{replica.name} answered {resp.status} to the webhook: {text}")
