"""The CLI run beside ``opsloop local`` (issue 15): in the folder where local mode keeps its
database and workspace file, ``replay``, ``tools``, ``policy check``, ``config check``
and ``doctor`` see what local mode loads (its tool modules and localslack/opsloop.yaml),
while it runs. Real processes: ``opsloop local`` with the offline model, the CLI beside.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import beside_local
from engine.config import load_settings
from localslack.state_file import state_path
from tests.bot.test_cli import ROOT, _free_port
from tests.bot.test_local_cli import (
    ALICE,
    OPS,
    _needs_the_offline_model,
    assert_clean_stop,
    http,
    local_env,
    opsloop_local,
    shown,
    thread_of,
    trace_status,
    wait_for,
)


def cli(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ask(url: str, text: str) -> str:
    status, posted = http(
        "POST", f"{url}ui/messages", {"user": ALICE, "channel": OPS, "text": text}
    )
    assert status == 201, posted
    return str(posted["message"]["ts"])


@pytest.mark.parametrize(
    ("database", "state"),
    [
        ("sqlite:///{d}/opsloop.db", ""),
        ("sqlite:///{d}/data/bot.sqlite3", ""),
        ("sqlite:///{d}/opsloop.db", "{d}/elsewhere/ws.json"),
        ("postgresql://postgres@127.0.0.1:5432/test", "{d}/ws.json"),
    ],
)
def test_beside_local_is_where_local_mode_keeps_its_workspace(
    tmp_path: Path, database: str, state: str
) -> None:
    """The CLI decides "beside local mode" without importing it: by the same rule as
    local mode places its workspace file (localslack.state_file.state_path)."""
    env = {
        "DATABASE_URL": database.format(d=tmp_path),
        "OPSLOOP_LOCAL_STATE": state.format(d=tmp_path),
    }
    settings = load_settings(env)
    where = state_path(settings.database_url, {"OPSLOOP_LOCAL_STATE": settings.local_state or ""})
    assert beside_local(settings) is None  # nothing there yet
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("{}")
    assert beside_local(settings) == where


def test_a_workspace_file_in_the_folder_is_no_sign_for_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "opsloop.local.json").write_text("{}")  # a local run on ./opsloop.db
    settings = load_settings({"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/test"})
    assert state_path(settings.database_url) == Path("opsloop.local.json")
    assert beside_local(settings) is None


@pytest.mark.slow
def test_the_cli_beside_local_mode_sees_what_local_mode_loads(tmp_path: Path) -> None:
    _needs_the_offline_model()
    port = _free_port()
    env = local_env(tmp_path, port)
    with opsloop_local(tmp_path, env) as running:
        url = running.first_line().removeprefix("opsloop local: open ")
        listed = ask(url, "@opsloop list services")  # an MCP tool, run at once
        deploy = ask(url, "@opsloop deploy api version 1.4.2 to production")  # rule 4, 2 of 2
        restart = ask(url, "@opsloop restart api")  # an HTTP action of the bundled file
        wait_for(lambda: trace_status(url, listed), lambda s: s == "idle", running)
        for root in (deploy, restart):
            wait_for(
                lambda r=root: thread_of(url, r), lambda t: "opsloop_approve" in shown(t), running
            )

        # replay: every decision recomputed with the tools it was offered (the catalog's
        # MCP tools, the HTTP action, the demo modules), not "MISMATCH" on every one.
        for root in (listed, deploy, restart):
            replayed = cli(tmp_path, env, "replay", f"{OPS}/{root}", "--all")
            assert replayed.returncode == 0, replayed.stdout + replayed.stderr
            verdicts = replayed.stdout.splitlines()
            assert verdicts and all(": ok (projection" in v for v in verdicts), verdicts
            assert "beside opsloop local (" in replayed.stderr

        # tools: the bot's tools, not the two built-ins.
        listing = cli(tmp_path, env, "tools", "--json")
        assert listing.returncode == 0, listing.stderr
        names = {json.loads(line)["name"] for line in listing.stdout.splitlines()}
        assert {
            "deploy",
            "run_job",
            "check_health",
            "restart_service",
            "mcp__catalog__list_services",
            "mcp__catalog__scale_service",
        } <= names
        assert "warning" not in listing.stderr  # every rule of the bundled file matches

        # policy check: the recorded calls under the file that decided them: nothing
        # differs (it said production deploys would become run_now, looser).
        checked = cli(tmp_path, env, "policy", "check")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.splitlines()[-1].startswith("3 recorded calls checked: 0 would")

        # config check: local mode's own file, its ${OPSLOOP_LOCAL_*} filled in as local
        # mode fills them; a copy made one's own resolves them too.
        config = cli(tmp_path, env, "config", "check")
        assert config.returncode == 0, config.stderr
        assert "localslack/opsloop.yaml: valid (0 modules, 1 MCP servers, 1 HTTP" in config.stdout
        own = tmp_path / "mine.yaml"
        own.write_text((ROOT / "localslack" / "opsloop.yaml").read_text())
        copied = cli(tmp_path, {**env, "OPSLOOP_CONFIG": str(own)}, "config", "check")
        assert copied.returncode == 0, copied.stderr
        assert copied.stdout.startswith(f"{own}: valid (")

        # doctor: no Slack token, signing secret or model key is a failure here.
        doctor = cli(tmp_path, env, "doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        out = doctor.stdout.splitlines()
        for check in ("slack token", "slack scopes", "signing secret", "model", "mcp catalog"):
            line = next(x for x in out if x.split(None, 1)[1].startswith(check))
            assert line.startswith("ok "), line
            if not check.startswith("mcp"):
                assert "not needed by opsloop local" in line
        assert "FAIL" not in doctor.stdout
        # The same process's setup checked as `opsloop serve` would run it does fail.
        served = cli(tmp_path, env, "doctor", "--serve")
        assert served.returncode == 1
        assert "SLACK_BOT_TOKEN is not set" in served.stdout

        code = running.stop()
    assert_clean_stop(running, code)
