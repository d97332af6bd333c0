"""Running the crash child (tests/support/crash_child.py) as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "support" / "crash_child.py"


def child_env(db_url: str, effects: Path, faults: str | None = None) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": db_url, "EFFECTS_DIR": str(effects)}
    env["PYTHONPATH"] = str(ROOT)
    env.pop("OPSLOOP_FAULTS", None)
    if faults:
        env["OPSLOOP_FAULTS"] = faults
    return env


def run_child(db_url: str, effects: Path, faults: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHILD)],
        env=child_env(db_url, effects, faults),
        capture_output=True,
        text=True,
        timeout=90,
    )


def lines(path: Path) -> list[str]:
    """The lines of a side-effect ledger (empty if nothing was written)."""
    return path.read_text().split("\n")[:-1] if path.exists() else []
