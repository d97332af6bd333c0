"""``opsloop local``'s GitHub, PagerDuty and alerts, in-process, with the offline
phrasebook and the bundled opsloop.yaml: a deploy through CI that is approved, runs in
the local GitHub and is reported when its webhook arrives; a production deploy only the
on-call user (bob, says the local PagerDuty) may approve; and the page's "Fire an
alert" button, whose signed alert opens a thread the bot investigates read-only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.alerts import generic_signature
from bot.hooks import SIGNATURE_HEADER, TIMESTAMP_HEADER
from bot.local_mode import Local, start_local
from bot.render.approval import APPROVE_ACTION
from bot.runtime import bind
from engine.config import load_settings
from engine.models import phrasebook
from engine.models.phrasebook import PhrasebookModel
from localslack import integrations
from localslack.demo import demo_config
from localslack.identity import PEOPLE
from tests.bot.test_local import ALICE, BOB, CAROL, OPS, Page, card_of, events_of, stop, texts
from tests.tools.test_demo import demo_loaded

Start = Callable[..., Awaitable[Page]]


@pytest.fixture
async def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Start]:
    monkeypatch.setenv("OPSLOOP_DEMO_URL", f"sqlite:///{tmp_path / 'demo.db'}")
    monkeypatch.setattr(integrations, "RUN_SECONDS", 1.0)  # a run takes 1 s, not 4
    settings = load_settings(
        {
            "DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}",
            "OPSLOOP_SWEEP_SECONDS": "60",
            "OPSLOOP_TOOLS": "tools.builtin,tools.demo",
        }
    )
    running: list[tuple[Local, aiohttp.ClientSession]] = []

    async def start_one(*, bundled: bool = True) -> Page:
        sock = bind("127.0.0.1", 0)
        try:
            local = await start_local(
                settings,
                sock,
                make_model=PhrasebookModel,
                model_kind="offline",
                state=tmp_path / "workspace.json",
                retry_delays=(0.05, 0.2),
                bundled=bundled,
            )
        except BaseException:
            sock.close()
            raise
        http = aiohttp.ClientSession()
        running.append((local, http))
        return Page(local, http)

    # tools.demo's tools leave the global REGISTRY afterwards: a later test's CLI process
    # (opsloop replay) would not offer them, and its prompt hashes would differ.
    with demo_loaded():
        yield start_one
        for local, http in running:
            await stop(local, http)


def saying(text: str) -> Callable[[dict[str, Any]], bool]:
    return lambda thread: text in texts(thread)


async def test_a_deploy_through_ci_is_approved_runs_and_its_webhook_reports_it(
    start: Start,
) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop deploy api to staging through CI"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    assert (await page.click(CAROL, card, APPROVE_ACTION))["ok"] is True
    done = await page.wait_thread(root, saying("Deployed api to staging through CI"))
    assert "the Deploy run" in texts(done) and "succeeded in" in texts(done)

    github = page.local.integrations.github
    [dispatch] = github.dispatches()
    events = await events_of(page, root)
    requested = next(e for e in events if e.type == "tool_call_requested")
    assert dispatch.body["inputs"] == {
        "service": "api",
        "environment": "staging",
        "opsloop_key": requested.idempotency_key,
    }
    finished = next(e for e in events if e.type == "wait_finished")
    assert finished.actor == "github"  # the webhook, not the poll (15 s away)
    assert finished.result["conclusion"] == "success"


async def test_only_the_on_call_user_may_approve_a_production_deploy_through_ci(
    start: Start,
) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop deploy api to production through CI"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    shown = json.dumps(card["blocks"])
    assert "On call now" in shown and f"<@{BOB}>" in shown  # looked up when it was posted

    refused = await page.click(CAROL, card, APPROVE_ACTION)  # reviews, but is not on call
    assert refused["ok"] is True  # Slack's ack: the refusal is said to carol, privately
    events = await events_of(page, root)
    assert [e.actor for e in events if e.type == "approval_refused"] == [CAROL]
    assert not page.local.integrations.github.dispatches()

    await page.click(BOB, card, APPROVE_ACTION)
    await page.wait_thread(root, saying("Deployed api to production through CI"))
    events = await events_of(page, root)
    assert [e.actor for e in events if e.type == "approval_granted"] == [BOB]
    [dispatch] = page.local.integrations.github.dispatches()
    assert dispatch.body["inputs"]["environment"] == "production"
    # PagerDuty was asked, and Slack found bob by the email PagerDuty has for him.
    assert page.local.integrations.pagerduty.calls_to("GET", "/oncalls")


async def test_who_is_on_call_asks_the_local_pagerduty(start: Start) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop who is on call?"))["ts"]
    done = await page.wait_thread(root, saying("On call now, says PagerDuty"))
    bob = next(p for p in PEOPLE if p.id == BOB)
    assert bob.real_name in texts(done) and bob.email in texts(done)
    assert card_of(done) is None  # a read: it runs at once


async def test_the_pages_alert_opens_a_thread_the_bot_investigates_read_only(
    start: Start,
) -> None:
    page = await start()
    status, fired = await page.post("/ui/alerts", {"user": ALICE})
    assert status == 200 and fired["ok"] is True, fired
    assert fired["channel"] == OPS

    async def alert_root() -> dict[str, Any] | None:
        _, data = await page.get(f"/ui/channels/{OPS}/messages", user=ALICE)
        bot = page.local.workspace.identity.bot_user_id
        return next((m for m in data["messages"] if m.get("user") == bot), None)

    root = None
    for _ in range(200):
        if (root := await alert_root()) is not None:
            break
        await asyncio.sleep(0.05)
    assert root is not None, "the alert's root message was never posted"
    done = await page.wait_thread(root["ts"], saying("I only looked: nothing was changed"))
    assert "api is healthy" in texts(done)
    events = await events_of(page, root["ts"])
    first = events[0]
    assert (first.type, first.actor, first.status) == ("alert_received", "alert:generic", "firing")
    assert first.labels["service"] == "api"
    calls = [(e.intent, e.policy) for e in events if e.type == "tool_call_requested"]
    assert calls == [("check_health", "run_now")]  # a read, run at once: nothing changed


async def test_without_alerts_in_the_file_there_is_no_alert_to_fire(start: Start) -> None:
    page = await start(bundled=False)
    _, info = await page.get("/ui/workspace", user=ALICE)
    assert info["alerts"] is None  # the page hides its button
    status, answer = await page.post("/ui/alerts", {"user": ALICE})
    assert status == 409 and "alerts.generic" in answer["error"]


async def test_the_web_api_finds_local_users_by_their_email(start: Start) -> None:
    page = await start(bundled=False)
    api = page.url + "api/users.lookupByEmail"
    headers = {"Authorization": f"Bearer {page.local.runtime.client.token}"}
    for person in PEOPLE:
        async with page.http.post(api, data={"email": person.email.upper()}, headers=headers) as r:
            answer = await r.json()
        assert answer["ok"] is True and answer["user"]["id"] == person.id
    async with page.http.post(api, data={"email": "nobody@x.example"}, headers=headers) as r:
        assert (await r.json())["error"] == "users_not_found"


# --- the pieces ----------------------------------------------------------------------------


def test_the_alert_is_signed_as_the_generic_route_checks_it() -> None:
    body = b'{"fingerprint": "x"}'
    assert integrations.alert_signature("s3cret", "1700000000", body) == generic_signature(
        "s3cret", "1700000000", body
    )
    assert (integrations.TIMESTAMP_HEADER, integrations.SIGNATURE_HEADER) == (
        TIMESTAMP_HEADER,
        SIGNATURE_HEADER,
    )


def test_the_bundled_file_points_at_the_local_github_and_pagerduty(tmp_path: Path) -> None:
    config = demo_config("http://127.0.0.1:3999/", tmp_path / "opsloop.local.json")
    github, pagerduty = config.integrations.github, config.integrations.pagerduty
    assert github is not None and pagerduty is not None
    assert github.api_url == "http://127.0.0.1:3999/github"
    assert github.repos == [integrations.REPO] == [phrasebook.CI_REPO]
    assert github.token is not None and github.token.get_secret_value() == integrations.GITHUB_TOKEN
    assert integrations.WORKFLOW == phrasebook.CI_WORKFLOW
    assert pagerduty.api_url == "http://127.0.0.1:3999/pagerduty"
    assert config.alerts.generic is not None and config.alerts.generic.channel == OPS
    on_call = next(r for r in config.policy if r.approvers == [f"oncall:{integrations.SCHEDULE}"])
    assert on_call.tool == phrasebook.DISPATCH
