"""`opsloop replay` recomputes a decision's request from the log and checks its hash."""

from __future__ import annotations

import json

import sqlalchemy as sa
from pydantic import BaseModel

from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.runner import Runner
from engine.store import ThreadKey, open_store
from tests.bot.test_cli import run_cli
from tools import REGISTRY, ToolContext, ToolRegistry, load_tools, tool

KEY = ThreadKey("T1", "C9", "1700000000.000900")


async def seed(db: str) -> str:
    load_tools(None)  # the built-ins, as the CLI will load them
    store = await open_store(db)
    try:
        posted = await post_user_message(
            store, KEY, text="how do deploys work?", user="U1", dedupe_key="e1"
        )
        model = ScriptedModel([call("search_docs", query="deploy"), say("See docs/deploy.md.")])
        await Runner(store, model, REGISTRY).run(posted.thread_id)
        return posted.thread_id
    finally:
        await store.close()


async def test_replay_prints_the_request_and_confirms_every_hash(sqlite_url, tmp_path):
    await seed(sqlite_url)
    ref = f"{KEY.channel}/{KEY.root_ts}"
    shown = run_cli("replay", ref, db=sqlite_url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "how do deploys work?" in shown.stdout
    assert "search_docs" in shown.stdout
    assert ": ok (projection v2" in shown.stdout.splitlines()[-1]

    every = run_cli("replay", ref, "--all", db=sqlite_url, cwd=tmp_path)
    assert every.returncode == 0
    assert [line.split(":")[1].strip()[:2] for line in every.stdout.splitlines()] == ["ok"] * 2

    body = run_cli("replay", ref, "--seq", "2", "--json", db=sqlite_url, cwd=tmp_path)
    assert body.returncode == 0
    request = json.loads(body.stdout)
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "[U1] how do deploys work?"}]}
    ]
    assert {t["name"] for t in request["tools"]} >= {"search_docs", "request_clarification"}


async def test_replay_reports_a_log_that_no_longer_matches(sqlite_url, tmp_path):
    thread_id = await seed(sqlite_url)
    store = await open_store(sqlite_url)
    try:
        async with store.engine.begin() as conn:  # someone edits history behind our back
            await conn.execute(
                sa.text("UPDATE events SET payload = :p WHERE thread_id = :t AND seq = 1"),
                {"p": json.dumps({"text": "something else", "source": {}}), "t": thread_id},
            )
    finally:
        await store.close()
    checked = run_cli("replay", thread_id, "--all", db=sqlite_url, cwd=tmp_path)
    assert checked.returncode == 1
    assert "MISMATCH" in checked.stdout


async def test_replay_of_an_unknown_decision_is_one_line_and_exit_2(sqlite_url, tmp_path):
    thread_id = await seed(sqlite_url)
    done = run_cli("replay", thread_id, "--seq", "1", db=sqlite_url, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "no model decision at seq 1" in done.stderr


async def seed_with(db: str, tools: ToolRegistry, text: str = "deploy api please") -> str:
    store = await open_store(db)
    try:
        posted = await post_user_message(store, KEY, text=text, user="U1", dedupe_key="e1")
        model = ScriptedModel([call("search_docs", query="deploy"), say("Done.")])
        await Runner(store, model, tools).run(posted.thread_id)
        return posted.thread_id
    finally:
        await store.close()


async def test_a_local_mode_thread_replays_beside_local_mode_and_says_what_is_missing_elsewhere(
    sqlite_url, tmp_path
):
    local = ToolRegistry()
    load_tools("tools.builtin,tools.demo", local)  # what `opsloop local` loads
    assert {"deploy", "run_job"} <= set(local.names())
    thread_id = await seed_with(sqlite_url, local)
    # Not beside local mode (no workspace file): this process lacks the demo tools, so
    # the decisions cannot be recomputed. That is its own verdict and exit status.
    elsewhere = run_cli("replay", thread_id, "--all", db=sqlite_url, cwd=tmp_path)
    assert elsewhere.returncode == 3, elsewhere.stdout + elsewhere.stderr
    lines = elsewhere.stdout.splitlines()
    assert len(lines) == 2 and not any("MISMATCH" in line for line in lines)
    assert all(": tools not loaded here: check_health, deploy, run_job (" in x for x in lines)
    # Beside it (its workspace file next to the database): what local mode loads.
    (tmp_path / "opsloop.local.json").write_text("{}")
    every = run_cli("replay", thread_id, "--all", db=sqlite_url, cwd=tmp_path)  # no OPSLOOP_TOOLS
    assert every.returncode == 0, every.stdout + every.stderr
    assert [line.split(":")[1].strip()[:2] for line in every.stdout.splitlines()] == ["ok"] * 2
    assert "beside opsloop local" in every.stderr


class Page(BaseModel):
    who: str


async def test_a_decision_whose_tools_are_not_loaded_here_is_not_a_mismatch(sqlite_url, tmp_path):
    elsewhere = ToolRegistry()
    load_tools(None, elsewhere)

    @tool(registry=elsewhere)
    async def page_oncall(args: Page, ctx: ToolContext) -> dict:
        """Page whoever is on call."""
        return {}

    thread_id = await seed_with(sqlite_url, elsewhere)
    every = run_cli("replay", thread_id, "--all", db=sqlite_url, cwd=tmp_path)
    assert every.returncode == 3  # not 1: nothing was found to differ
    lines = every.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "MISMATCH" not in line
        # (and whatever else earlier tests of this process registered)
        assert ": tools not loaded here: " in line and "page_oncall" in line.split(" (")[0]
    one = run_cli("replay", thread_id, db=sqlite_url, cwd=tmp_path)
    assert one.returncode == 3
    assert one.stdout.splitlines()[-1].startswith("seq 6: tools not loaded here: ")
