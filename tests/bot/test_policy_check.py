"""``opsloop policy check``, run as a real process against a SQLite database whose calls
were recorded by the real runner under a policy, and candidate policy files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import BaseModel

from engine.config_file import parse_config
from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.reviewers import ReviewerRule
from engine.rules import Defaults, PolicySet
from engine.runner import Runner
from engine.store import ThreadKey, open_store
from tests.bot.test_cli import assert_one_line_error, run_cli
from tools import REGISTRY, ToolContext, ToolRegistry, load_tools, tool

TICKET = ThreadKey("T1", "C0OPS", "1700000000.000100")
DOCS = ThreadKey("T1", "C0DEV", "1700000001.000100")
PAGE = ThreadKey("T1", "C0OPS", "1700000002.000100")

RECORDED = """
approvals:
  approvers: [S0SRE]
policy:
  - tool: create_ticket
    policy: approve_before_run
    approvers: [S0SRE]
"""


async def seed(url: str) -> dict[str, str]:
    """Two threads: a ticket waiting for its approval (rule 1), a docs search (no rule)."""
    load_tools(None)
    config = parse_config(RECORDED, {})
    policy = PolicySet(
        tuple(config.policy), Defaults(ReviewerRule(frozenset({"S0SRE"}))), config.policy_hash
    )
    store = await open_store(url)
    try:
        ids = {}
        for name, key, steps in [
            ("ticket", TICKET, [call("create_ticket", title="disk full", priority="high")]),
            ("docs", DOCS, [call("search_docs", query="rollback"), say("Found nothing.")]),
        ]:
            posted = await post_user_message(store, key, text="help", user="U0ALICE")
            runner = Runner(store, ScriptedModel(steps), REGISTRY.copy(), policy=policy)
            await runner.run(posted.thread_id)
            ids[name] = posted.thread_id
        return ids
    finally:
        await store.close()


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[str, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'calls.db'}"
    return url, asyncio.run(seed(url))


def check(tmp_path: Path, db: str, policy: str, *args: str):
    (tmp_path / "candidate.yaml").write_text(policy)
    return run_cli("policy", "check", "--config", "candidate.yaml", *args, db=db, cwd=tmp_path)


def test_the_same_policy_changes_nothing(recorded, tmp_path: Path) -> None:
    db, _ = recorded
    proc = check(tmp_path, db, RECORDED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "2 recorded calls checked: 0 would be decided differently, 0 looser or mixed"
    ]


def test_a_looser_rule_is_listed_and_fails(recorded, tmp_path: Path) -> None:
    db, ids = recorded
    proc = check(tmp_path, db, "policy:\n  - tool: create_ticket\n    policy: run_now\n")
    assert proc.returncode == 1, proc.stderr
    first, summary = proc.stdout.splitlines()
    assert first.startswith(f"{ids['ticket']} seq=")
    assert "create_ticket: approve_before_run (rule 1) -> run_now (rule 1)" in first
    assert first.endswith(": looser")
    assert summary.endswith("1 would be decided differently, 1 looser or mixed")


def test_a_wider_approver_list_is_looser(recorded, tmp_path: Path) -> None:
    db, _ = recorded
    wider = RECORDED.replace("approvers: [S0SRE]\n", "approvers: [S0SRE, U0DAVE]\n", 2)
    proc = check(tmp_path, db, wider)
    assert proc.returncode == 1
    assert "approvers S0SRE -> S0SRE,U0DAVE" in proc.stdout
    assert "looser" in proc.stdout


def test_a_stricter_policy_is_listed_and_passes(recorded, tmp_path: Path) -> None:
    db, ids = recorded
    stricter = RECORDED + (
        "    quorum: 2\n  - tool: search_docs\n    policy: reject\n    reason: no docs today\n"
    )
    proc = check(tmp_path, db, stricter)
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    assert len(lines) == 3
    assert "quorum 1 -> 2: stricter" in lines[0]
    assert lines[1].startswith(ids["docs"]) and "run_now (no rule) -> reject (rule 2)" in lines[1]
    assert lines[1].endswith(": stricter")


def test_a_channel_rule_uses_the_thread_s_channel(recorded, tmp_path: Path) -> None:
    db, _ = recorded
    here = RECORDED + "    channels: [C0OPS]\n"  # where the ticket was asked for: the same
    assert check(tmp_path, db, here).returncode == 0
    elsewhere = RECORDED + "    channels: [C0ELSE]\n"
    proc = check(tmp_path, db, elsewhere)
    assert proc.returncode == 0 and "-> reject (rule 1)" in proc.stdout  # stricter


def test_only_the_threads_named_are_checked(recorded, tmp_path: Path) -> None:
    db, ids = recorded
    loose = "policy:\n  - tool: create_ticket\n    policy: run_now\n"
    proc = check(tmp_path, db, loose, ids["docs"], "--since", "7d")
    assert proc.returncode == 0
    assert proc.stdout.startswith("1 recorded calls checked: 0 would")
    by_key = check(tmp_path, db, loose, f"{TICKET.channel}/{TICKET.root_ts}")
    assert by_key.returncode == 1


def test_bad_arguments_and_files_are_one_line_exit_2(recorded, tmp_path: Path) -> None:
    db, _ = recorded
    assert_one_line_error(check(tmp_path, db, RECORDED, "--since", "soon"), "--since", "soon")
    assert_one_line_error(
        check(tmp_path, db, "policy:\n  - tool: x\n    policy: maybe\n"),
        "candidate.yaml: policy[0].policy",
    )
    missing = run_cli("policy", "check", "--config", "nope.yaml", db=db, cwd=tmp_path)
    assert_one_line_error(missing, "nope.yaml: no such file")


def test_a_call_decided_by_another_rule_to_the_same_effect_is_not_counted_as_different(
    recorded, tmp_path: Path
) -> None:
    """Issue 15: the summary counted the lines that say "same"."""
    db, ids = recorded
    moved = RECORDED.replace("policy:\n", "policy:\n  - tool: page_someone\n    policy: reject\n")
    proc = check(tmp_path, db, moved)
    assert proc.returncode == 0, proc.stderr
    line, summary = proc.stdout.splitlines()
    assert line.startswith(f"{ids['ticket']} seq=") and line.endswith(": same")
    assert "(rule 1) -> approve_before_run (rule 2)" in line
    assert summary == (
        "2 recorded calls checked: 0 would be decided differently, 0 looser or mixed; "
        "1 by another rule to the same effect"
    )


class PageArgs(BaseModel):
    who: str


async def seed_unknown_tool(url: str) -> str:
    """A call of a tool the CLI does not load, decided by a rule when it was made."""
    elsewhere = ToolRegistry()

    @tool(policy="run_now", registry=elsewhere)
    async def page_oncall(args: PageArgs, ctx: ToolContext) -> dict:
        """Page whoever is on call."""
        return {}

    config = parse_config("policy:\n  - {tool: page_oncall, policy: approve_before_run}\n", {})
    policy = PolicySet(tuple(config.policy), Defaults(), config.policy_hash)
    store = await open_store(url)
    try:
        posted = await post_user_message(store, PAGE, text="page bob", user="U0ALICE")
        model = ScriptedModel([call("page_oncall", who="bob")])
        await Runner(store, model, elsewhere, policy=policy).run(posted.thread_id)
        return posted.thread_id
    finally:
        await store.close()


def test_a_tool_not_loaded_here_is_named_not_given_a_policy(tmp_path: Path) -> None:
    """Issue 15: with no rule for it now, a tool's own policy would decide, and a tool
    this process does not load has none it knows: not judged (exit 3), never looser."""
    db = f"sqlite:///{tmp_path / 'calls.db'}"
    thread_id = asyncio.run(seed_unknown_tool(db))
    proc = check(tmp_path, db, "policy: []\n")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    line, summary = proc.stdout.splitlines()
    assert line == (
        f"{thread_id} seq=3 page_oncall: approve_before_run (rule 1) -> no rule: page_oncall "
        "is not a tool loaded here, so the policy it would get of its own is unknown: "
        "not judged"
    )
    assert summary == (
        "1 recorded calls checked: 0 would be decided differently, 0 looser or mixed; "
        "1 not judged (not loaded here: page_oncall)"
    )
    # A rule that matches decides without the tool: judged as any call.
    proc = check(tmp_path, db, "policy:\n  - {tool: 'page_*', policy: run_now}\n")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0].endswith("-> run_now (rule 1): looser")
