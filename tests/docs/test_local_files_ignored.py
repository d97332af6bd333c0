"""What `make run` (`opsloop local`) leaves in the project folder is ignored by git: a
newcomer's `git status` stays clean after trying it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from engine.db import DEFAULT_DATABASE_URL, parse_database_url
from engine.store.locks import WorkerLocks
from localslack.demo import catalog_path
from localslack.state_file import state_path

ROOT = Path(__file__).resolve().parents[2]


def _left_by_local_mode() -> list[str]:
    """The files local mode writes with the default settings, named by its own code."""
    database = parse_database_url(DEFAULT_DATABASE_URL).url.database
    assert database is not None
    workspace = state_path(DEFAULT_DATABASE_URL, {})
    catalog = catalog_path(workspace)
    return [
        database,
        f"{database}-wal",
        f"{database}-shm",
        WorkerLocks(database).path("vm:4242:0a1b2c"),
        workspace.as_posix(),
        catalog.as_posix(),
        # Their copies while being replaced (localslack/state_file.py, tools/demo_mcp.py).
        f".{workspace.name}.k3v9x0.tmp",
        f"{catalog.name}.tmp",
    ]


def test_what_local_mode_writes_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = _left_by_local_mode()
    assert "opsloop.db.workers/vm:4242:0a1b2c.lock" in names
    assert "opsloop.local.catalog.json" in names
    tracked = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    # --non-matching lists every path; "::\t<path>" is one no rule ignores.
    not_ignored = [
        line.split("\t", 1)[1] for line in tracked.stdout.splitlines() if line[:2] == "::"
    ]
    assert tracked.returncode in (0, 1), tracked.stderr
    assert not_ignored == [], f"add to .gitignore: {not_ignored}"
