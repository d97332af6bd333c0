"""The browser tests' shared fixtures: headless Chromium (Debian's ``chromium``, driven by
Playwright), ``opsloop local`` as a real process, and a page open on it as alice.

Skipped where no browser is installed, except in CI, where ``.ci/run`` installs it and a
missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_cli import _free_port
from tests.bot.test_local_cli import Running, local_env, opsloop_local

CHROMIUM = os.environ.get("OPSLOOP_CHROMIUM", "/usr/bin/chromium")
OPS = "C0OPS"
WAIT_MS = 30_000
VIEWPORT = {"width": 1400, "height": 860}


def _browser_or_skip() -> str:
    if Path(CHROMIUM).exists() or shutil.which(CHROMIUM):
        return CHROMIUM
    reason = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = _browser_or_skip()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def started(running: Running) -> str:
    """The page's URL, from the first line ``opsloop local`` prints (kept on ``running``)."""
    line = running.first_line()
    found = re.search(r"http://\S+", line)
    assert found, line
    running.url = found.group(0)
    return running.url


def local_settings(tmp_path: Path) -> dict[str, str]:
    """A fresh shell's environment for ``opsloop local`` on a free port (a restart with
    the same settings finds the same database, workspace file and port)."""
    return local_env(tmp_path, _free_port(), OPSLOOP_SWEEP_SECONDS="1")


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Running]:
    with opsloop_local(tmp_path, local_settings(tmp_path)) as running:
        started(running)
        yield running
        assert running.stop() == 0, running.stderr()[-3000:]


@contextlib.contextmanager
def open_page(browser: Any, url: str) -> Iterator[Any]:
    """A page on ``url``'s #ops, once its live updates are connected."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{url}#/{OPS}")
    page.get_by_test_id("connection-status").and_(page.locator("[data-state=live]")).wait_for()
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def page(browser, local: Running) -> Iterator[Any]:
    with open_page(browser, local.url) as opened:
        yield opened
