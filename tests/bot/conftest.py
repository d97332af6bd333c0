"""Fixtures for the assembled process: the fakes it talks to, and the runtime itself."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.runtime import Runtime, start_runtime
from engine.config import load_settings
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic
from tests.fakes.slack import SIGNING_SECRET, TOKEN, FakeSlack


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[FakeSlack, FakeAnthropic]]:
    async with FakeSlack() as slack, FakeAnthropic() as claude:
        yield slack, claude
    claude.assert_clean()


@pytest.fixture
async def runtime(db_url, fakes, tmp_path) -> AsyncIterator[Runtime]:
    slack, claude = fakes
    settings = load_settings(
        {
            "DATABASE_URL": db_url,
            "OPSLOOP_SWEEP_SECONDS": "0.2",
            "ANTHROPIC_API_KEY": FAKE_API_KEY,
            "ANTHROPIC_BASE_URL": claude.url,
            "SLACK_API_URL": slack.url,
            "OPSLOOP_TICKETS_URL": f"sqlite:///{tmp_path / 'tickets.db'}",
        }
    )
    rt = await start_runtime(settings, token=TOKEN, signing_secret=SIGNING_SECRET)
    rt.start()
    try:
        yield rt
    finally:
        await rt.close(5)
