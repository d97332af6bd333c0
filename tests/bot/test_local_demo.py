"""``opsloop local`` with its own opsloop.yaml, in-process, with the offline phrasebook:
the catalog MCP server (reads run at once, a write needs approval, a simulated crash ends
on the reconcile card), the restart HTTP action against the page's own endpoint, and the
production deploy that needs both bob and carol."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.local_mode import Local, start_local
from bot.render.approval import APPROVE_ACTION
from bot.render.modals import NOTE_ACTION, NOTE_BLOCK
from bot.render.reconcile import ABANDON_ACTION, HAPPENED_ACTION, RETRY_ACTION
from bot.runtime import bind
from engine.config import load_settings
from engine.models.phrasebook import PhrasebookModel, help_text
from localslack.demo import DEMO_CONFIG, catalog_path, demo_config
from tests.bot.test_local import ALICE, BOB, CAROL, Page, card_of, events_of, stop, stream, texts
from tests.tools.test_demo import demo_loaded

Start = Callable[[], Awaitable[Page]]


@pytest.fixture
async def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Start]:
    monkeypatch.setenv("OPSLOOP_DEMO_URL", f"sqlite:///{tmp_path / 'demo.db'}")
    settings = load_settings(
        {
            "DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}",
            "OPSLOOP_SWEEP_SECONDS": "60",
            "OPSLOOP_TOOLS": "tools.builtin,tools.demo",
        }
    )
    running: list[tuple[Local, aiohttp.ClientSession]] = []

    async def start_one() -> Page:
        sock = bind("127.0.0.1", 0)
        try:
            local = await start_local(
                settings,
                sock,
                make_model=PhrasebookModel,
                model_kind="offline",
                state=tmp_path / "workspace.json",
                retry_delays=(0.05, 0.2),
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


def test_the_bundled_file_is_valid_and_names_the_demo(tmp_path: Path) -> None:
    config = demo_config("http://127.0.0.1:3999/", tmp_path / "opsloop.local.json")
    assert DEMO_CONFIG.name == "opsloop.yaml" and DEMO_CONFIG.parent.name == "localslack"
    catalog = config.tools.mcp["catalog"]
    assert catalog.args[-1] == str(tmp_path / "opsloop.local.catalog.json")
    assert catalog.args[:2] == ["-m", "tools.demo_mcp"]
    action = config.tools.http["restart_service"]
    assert action.url == "http://127.0.0.1:3999/demo/api/services/{service}/restart"
    assert action.idempotent and config.tools.http_allow_hosts == ["127.0.0.1"]
    production = next(r for r in config.policy if r.tool == "deploy")
    assert (production.quorum, production.approvers) == (2, ["U0BOB", "U0CAROL"])
    assert catalog_path(Path("x/opsloop.local.json")) == Path("x/opsloop.local.catalog.json")


async def test_catalog_reads_run_at_once_and_help_lists_the_new_phrases(start: Start) -> None:
    page = await start()
    names = set(page.local.runtime.tools.names())
    assert {
        "mcp__catalog__list_services",
        "mcp__catalog__scale_service",
        "restart_service",
    } <= names
    root = (await page.say(ALICE, "@opsloop list services"))["ts"]
    thread = await page.wait_thread(root, saying("The catalog has 3 services"))
    assert card_of(thread) is None  # a rule lets the read run without anyone
    events = await events_of(page, root)
    call = next(e for e in events if e.type == "tool_call_requested")
    assert (call.policy, call.rule, call.definition_hash is not None) == ("run_now", 0, True)

    help_root = (await page.say(ALICE, "@opsloop help"))["ts"]
    shown = texts(await page.wait_thread(help_root, saying("simulate a crash")))
    assert "restart api" in shown and "list services" in shown
    assert "simulate a crash" in help_text()


async def test_a_production_deploy_needs_bob_and_carol(start: Start) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop deploy api version 1.4.2 to production"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    assert "2 of" in json.dumps(card["blocks"])
    assert (await page.click(BOB, card, APPROVE_ACTION))["ok"] is True
    thread = await page.wait_thread(root, saying(f"1 of 2: <@{BOB}>"))
    card = card_of(thread)
    assert card is not None, "the card stays open until the quorum is met"
    assert "Deployed api" not in texts(thread)
    assert (await page.click(CAROL, card, APPROVE_ACTION))["ok"] is True
    await page.wait_thread(root, saying("Deployed api 1.4.2 to production"))
    votes = [e.actor for e in await events_of(page, root) if e.type == "approval_granted"]
    assert votes == [BOB, CAROL]


async def test_restart_calls_the_pages_endpoint_with_the_calls_key(start: Start) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop restart api"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    await page.click(CAROL, card, APPROVE_ACTION)
    await page.wait_thread(root, saying("Restarted api through the platform API (restart #1)"))
    platform = page.local.platform
    assert (platform.requests, platform.restarts) == (1, {"api": 1})
    events = await events_of(page, root)
    requested = next(e for e in events if e.type == "tool_call_requested")
    assert list(platform._done) == [requested.idempotency_key]


async def test_a_simulated_crash_ends_on_the_reconcile_card_and_happened_resumes(
    start: Start, tmp_path: Path
) -> None:
    page = await start()
    text = "@opsloop scale api to 5 replicas and simulate a crash"
    root = (await page.say(ALICE, text))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    await page.click(BOB, card, APPROVE_ACTION)
    thread = await page.wait_thread(root, lambda t: card_of(t, HAPPENED_ACTION))
    reconcile = card_of(thread, HAPPENED_ACTION)
    assert reconcile is not None and RETRY_ACTION in json.dumps(reconcile["blocks"])
    events = await events_of(page, root)
    assert [e.type for e in events].count("tool_outcome_unknown") == 1
    saved = json.loads(catalog_path(tmp_path / "workspace.json").read_text())
    assert saved["services"]["api"]["replicas"] == 5  # the effect happened before the crash

    async with stream(page, BOB) as bobs:
        await page.click(BOB, reconcile, HAPPENED_ACTION)
        view = (await bobs.wait("view_opened"))["view"]
        values = {NOTE_BLOCK: {NOTE_ACTION: "catalog shows 5 replicas"}}
        status, _ = await page.post(
            f"/ui/views/{view['id']}/submit", {"user": BOB, "values": values}
        )
        assert status == 200
    await page.wait_thread(root, saying("catalog shows 5 replicas"))
    events = await events_of(page, root)
    decided = next(e for e in events if e.type == "reconcile_decided")
    assert (decided.decision, decided.reviewer, decided.note) == (
        "happened",
        BOB,
        "catalog shows 5 replicas",
    )
    # The server came back for the next call, and the catalog kept the change.
    again = (await page.say(ALICE, "@opsloop show service api"))["ts"]
    await page.wait_thread(again, saying("5 replicas."))


async def test_run_it_again_runs_the_call_once_more_and_it_answers(start: Start) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop scale web to 4 replicas and simulate a crash"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    await page.click(BOB, card, APPROVE_ACTION)
    thread = await page.wait_thread(root, lambda t: card_of(t, RETRY_ACTION))
    reconcile = card_of(thread, RETRY_ACTION)
    assert reconcile is not None
    await page.click(BOB, reconcile, RETRY_ACTION)
    # Not "Scaled web to 4 replicas (it had 4)": the first attempt had made the change
    # before the crash, and the answer says so (issue 15 §12).
    await page.wait_thread(root, saying("web has 4 replicas: the interrupted call had taken"))
    events = await events_of(page, root)
    decided = next(e for e in events if e.type == "reconcile_decided")
    assert decided.decision == "retry"
    assert [e.type for e in events].count("tool_started") == 2


async def test_it_did_not_happen_is_answered_as_a_persons_word_not_as_the_catalogs(
    start: Start, tmp_path: Path
) -> None:
    """Issue 15 §10: after "It did not happen" the thread said "Not scaled" while the
    catalog showed the new count. The card hints how to check first, and the answer
    says whose word it was and where to look."""
    page = await start()
    root = (await page.say(ALICE, "@opsloop scale web to 3 replicas and simulate a crash"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    await page.click(BOB, card, APPROVE_ACTION)
    thread = await page.wait_thread(root, lambda t: card_of(t, ABANDON_ACTION))
    reconcile = card_of(thread, ABANDON_ACTION)
    assert reconcile is not None
    assert "“show service web”" in json.dumps(reconcile["blocks"], ensure_ascii=False)
    await page.click(BOB, reconcile, ABANDON_ACTION)
    # The answer streams in: wait for its last words, not its first.
    done = await page.wait_thread(root, saying("shows what the catalog has now"))
    assert "I did not run it again" in texts(done)
    assert "Not scaled" not in texts(done)
    assert "`show service web` shows what the catalog has now" in texts(done)
    saved = json.loads(catalog_path(tmp_path / "workspace.json").read_text())
    assert saved["services"]["web"]["replicas"] == 3  # the crash came after the change
