"""``opsloop doctor`` against real databases (SQLite, PostgreSQL), the fake Slack and
Anthropic servers and a real stdio MCP server: healthy is exit 0, every failure is exit
1 with its check's line, and no line shows a secret."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import load_configuration
from bot.doctor import BOT_SCOPES, run_doctor, skew_verdict
from engine.migrations import migrate
from tests.bot.test_cli import ROOT
from tests.bot.test_tools_cli import DRIFTING, SERVER
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic
from tests.fakes.slack import TOKEN, FakeSlack

SECRET = "sig-doctor-secret-7f3a"
MODEL = "claude-test-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(db: str, slack: FakeSlack, model: FakeAnthropic, **more: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db,
        "SLACK_BOT_TOKEN": TOKEN,
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_API_URL": slack.url,
        "ANTHROPIC_API_KEY": FAKE_API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "OPSLOOP_MODEL": MODEL,
        **more,
    }


async def doctor(
    env: dict[str, str], manifest: str | None = None, *, strict: bool = False
) -> tuple[int, list[str]]:
    """The doctor in this process, as the CLI runs it: its exit status and lines."""
    settings, config = load_configuration(env)
    lines: list[str] = []
    secrets = [TOKEN, SECRET, FAKE_API_KEY]
    code = await run_doctor(
        settings, config, manifest=manifest, secrets=secrets, out=lines.append, strict=strict
    )
    for line in lines:
        for secret in (TOKEN, SECRET):
            assert secret not in line
    return code, lines


def by_check(lines: list[str]) -> dict[str, tuple[str, str]]:
    """``{check: (ok|warn|FAIL, detail)}`` from the doctor's aligned lines."""
    out = {}
    for line in lines:
        match = re.fullmatch(r"(ok|warn|FAIL)\s+(.+?)\s{2,}(.*)", line)
        assert match, line
        out[match.group(2)] = (match.group(1), match.group(3))
    return out


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where there is no ./manifest.yml (the repository has one)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
async def migrated(db_url: str) -> str:
    await migrate(db_url)
    return db_url


@pytest.fixture
async def fakes():
    async with FakeSlack() as slack, FakeAnthropic(models=[MODEL]) as model:
        yield slack, model


async def test_a_healthy_setup_passes_every_check(migrated: str, fakes) -> None:
    slack, model = fakes
    code, lines = await doctor(environment(migrated, slack, model))
    checks = by_check(lines)
    assert code == 0, lines
    assert list(checks) == [
        "database",
        "clock",
        "slack token",
        "slack scopes",
        "signing secret",
        "model",
    ]
    assert all(status == "ok" for status, _ in checks.values()), lines
    assert "schema revision" in checks["database"][1]
    assert "bot opsloop" in checks["slack token"][1]
    assert (
        f"every scope of this release's manifest granted ({len(BOT_SCOPES)})"
        in (checks["slack scopes"][1])
    )
    if migrated.startswith("postgresql"):
        assert "the database clock is" in checks["clock"][1]
    assert model.model_lookups == [MODEL]
    assert [c.method for c in slack.calls] == ["auth.test"]  # one call for both checks


async def test_a_bad_token_fails_the_slack_checks(migrated: str, fakes) -> None:
    slack, model = fakes
    env = environment(migrated, slack, model, SLACK_BOT_TOKEN="xoxb-not-the-right-one")
    code, lines = await doctor(env)
    checks = by_check(lines)
    assert code == 1
    assert checks["slack token"] == ("FAIL", "auth.test refused the token: invalid_auth")
    assert checks["slack scopes"][0] == "FAIL"
    assert checks["database"][0] == checks["model"][0] == "ok"
    assert "xoxb-not-the-right-one" in env.values()


async def test_a_scope_in_the_manifest_the_token_lacks_fails(
    migrated: str, fakes, tmp_path: Path
) -> None:
    slack, model = fakes
    manifest = (ROOT / "manifest.yml").read_text()
    manifest = manifest.replace("      - users:read\n", "      - users:read\n      - pins:read\n")
    path = tmp_path / "manifest.yml"
    path.write_text(manifest)
    code, lines = await doctor(environment(migrated, slack, model), manifest=str(path))
    checks = by_check(lines)
    assert code == 1
    status, detail = checks["slack scopes"]
    assert status == "FAIL" and "lacks pins:read" in detail and str(path) in detail
    assert checks["slack token"][0] == "ok"


async def test_an_unreachable_database_fails_database_and_clock(fakes) -> None:
    slack, model = fakes
    db = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    code, lines = await doctor(environment(db, slack, model))
    checks = by_check(lines)
    assert code == 1
    assert checks["database"][0] == "FAIL"
    assert "cannot reach the database" in checks["database"][1]
    assert checks["clock"][0] == "FAIL"
    assert checks["slack token"][0] == checks["model"][0] == "ok"


async def test_a_database_without_tables_or_file_fails(fakes, tmp_path: Path) -> None:
    slack, model = fakes
    missing = tmp_path / "nowhere.db"
    code, lines = await doctor(environment(f"sqlite:///{missing}", slack, model))
    assert code == 1
    assert by_check(lines)["database"] == (
        "FAIL",
        f"no database file at {missing} (set DATABASE_URL)",
    )
    assert not missing.exists()  # a doctor changes nothing


async def test_a_refused_key_and_an_unknown_model_fail_the_model_check(
    migrated: str, fakes
) -> None:
    slack, model = fakes
    env = environment(migrated, slack, model, ANTHROPIC_API_KEY="sk-wrong-key-1234")
    code, lines = await doctor(env)
    assert code == 1
    assert by_check(lines)["model"] == ("FAIL", "the API key was refused (401)")
    assert "sk-wrong-key-1234" not in "\n".join(lines)
    code, lines = await doctor(environment(migrated, slack, model, OPSLOOP_MODEL="claude-nope"))
    assert code == 1
    assert by_check(lines)["model"] == (
        "FAIL",
        "the key is accepted but the model 'claude-nope' is unknown",
    )


async def test_a_missing_signing_secret_fails(migrated: str, fakes) -> None:
    slack, model = fakes
    code, lines = await doctor(environment(migrated, slack, model, SLACK_SIGNING_SECRET=""))
    assert code == 1
    status, detail = by_check(lines)["signing secret"]
    assert status == "FAIL" and "SLACK_SIGNING_SECRET is not set" in detail


async def test_an_mcp_server_is_reachable_and_its_definitions_stable(
    sqlite_url: str, fakes, tmp_path: Path
) -> None:
    slack, model = fakes
    await migrate(sqlite_url)
    drifting = tmp_path / "drifting.py"
    drifting.write_text(DRIFTING)
    config = tmp_path / "opsloop.yaml"
    config.write_text(
        "tools:\n  mcp:\n"
        f"    demo:\n      command: {sys.executable}\n      args: [{SERVER}, stdio]\n"
        "      tools: [echo, add]\n"
        f"    drifty:\n      command: {sys.executable}\n      args: [{drifting}]\n"
        f"    gone:\n      command: {sys.executable}\n      args: [{tmp_path / 'no.py'}]\n"
    )
    env = environment(sqlite_url, slack, model, OPSLOOP_CONFIG=str(config))
    code, lines = await doctor(env)
    checks = by_check(lines)
    assert code == 1
    assert checks["mcp demo"] == ("ok", "reachable (stdio); 2 tools, definitions stable")
    status, detail = checks["mcp drifty"]
    assert status == "FAIL" and "mcp__drifty__echo" in detail and "changed" in detail
    assert checks["mcp gone"][0] == "FAIL"


def test_clock_skew_over_five_seconds_fails() -> None:
    assert skew_verdict(0.2) == (True, "the database clock is 0.200 s ahead of this machine's")
    ok, detail = skew_verdict(-7.5)
    assert not ok and detail.startswith("the database clock is 7.500 s behind this machine's")


def test_the_built_in_scopes_are_the_manifests() -> None:
    import yaml

    manifest = yaml.safe_load((ROOT / "manifest.yml").read_text())
    assert sorted(manifest["oauth_config"]["scopes"]["bot"]) == sorted(BOT_SCOPES)


async def test_the_command_exits_1_naming_the_failed_check(fakes, tmp_path: Path) -> None:
    """``opsloop doctor`` as a real process: one line per check on stdout, exit 1."""
    slack, model = fakes
    db = f"sqlite:///{tmp_path / 'none.db'}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLACK_", "DATABASE_URL", "OPSLOOP_", "ANTHROPIC_"))
    }
    env.update(environment(db, slack, model), PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot.cli",
        "doctor",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, err
    assert err == b""
    checks = by_check(out.decode().splitlines())
    assert checks["database"][0] == "FAIL"
    assert [s for s, _ in checks.values()].count("FAIL") == 1, out.decode()
    assert TOKEN not in out.decode() and SECRET not in out.decode()


async def test_a_rule_that_matches_no_tool_is_a_warning_and_a_failure_with_strict(
    sqlite_url: str, fakes, tmp_path: Path
) -> None:
    """Issue 15: a misspelt reject guards nothing. The tools are the process's modules,
    its HTTP actions and what its MCP servers list."""
    slack, model = fakes
    await migrate(sqlite_url)
    config = tmp_path / "opsloop.yaml"
    config.write_text(
        "tools:\n  mcp:\n"
        f"    demo:\n      command: {sys.executable}\n      args: [{SERVER}, stdio]\n"
        "policy:\n"
        "  - {tool: mcp__demo__echo, policy: run_now}\n"  # a tool the server lists
        "  - {tool: create_tiket, policy: reject}\n"  # create_ticket, misspelt
        "  - {tool: 'search_*', policy: run_now}\n"
        "  - {tool: mcp__demo__delete_all, policy: reject}\n"  # the server has none
    )
    env = environment(sqlite_url, slack, model, OPSLOOP_CONFIG=str(config))
    code, lines = await doctor(env)
    checks = by_check(lines)
    assert code == 0, lines
    assert list(checks)[-1] == "policy rules"
    assert checks["policy rules"] == (
        "warn",
        "policy[1].tool (rule 2): 'create_tiket' matches no tool, so this reject rule "
        "decides nothing; policy[3].tool (rule 4): 'mcp__demo__delete_all' matches no tool, "
        "so this reject rule decides nothing",
    )
    code, lines = await doctor(env, strict=True)
    assert code == 1
    assert by_check(lines)["policy rules"][0] == "FAIL"

    config.write_text("policy:\n  - {tool: create_ticket, policy: reject}\n")
    code, lines = await doctor(env, strict=True)
    assert code == 0, lines
    status, detail = by_check(lines)["policy rules"]
    assert status == "ok" and detail.startswith("each of the 1 rules matches a tool (")


def test_after_a_local_run_slack_and_the_model_key_are_not_needed(tmp_path: Path) -> None:
    """Issue 15: beside `opsloop local` (its workspace file next to the database) the
    doctor checks what local mode needs; ``--serve`` checks what serve would need."""
    db = tmp_path / "opsloop.db"
    asyncio.run(migrate(f"sqlite:///{db}"))
    (tmp_path / "opsloop.local.json").write_text("{}")  # what a local run leaves
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLACK_", "DATABASE_URL", "OPSLOOP_", "ANTHROPIC_", "PORT"))
    }
    env["PYTHONPATH"] = str(ROOT)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bot.cli", "doctor", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    local = run()
    assert local.returncode == 0, local.stdout + local.stderr
    checks = by_check(local.stdout.splitlines())
    for name in ("slack token", "slack scopes", "signing secret", "model"):
        status, detail = checks[name]
        assert status == "ok" and detail.startswith("not needed by opsloop local"), name
    assert checks["mcp catalog"][0] == "ok"  # local mode's own MCP server, started here
    assert checks["policy rules"][0] == "ok"  # its rules match its tools

    served = run("--serve")
    assert served.returncode == 1
    failed = {
        n for n, (status, _) in by_check(served.stdout.splitlines()).items() if status == "FAIL"
    }
    assert failed == {"slack token", "slack scopes", "signing secret", "model"}

    (tmp_path / "opsloop.local.json").unlink()  # no local run here: serve's checks
    assert run().returncode == 1
    assert run("--local").returncode == 0
