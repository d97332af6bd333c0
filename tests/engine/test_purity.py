"""The pure core does no I/O and knows nothing of Slack (DESIGN, "Rules of the house")."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"
PURE = [
    "engine.events",
    "engine.state",
    "engine.policy",
    "engine.context",
    "engine.rules",
    "engine.audit",
    "engine.alerts",
]
FORBIDDEN = [
    "sqlalchemy",
    "sqlmodel",
    "slack_sdk",
    "slack_bolt",
    "aiohttp",
    "asyncpg",
    "aiosqlite",
    "anthropic",
    "apscheduler",
]


def imported_in_fresh_interpreter(modules: list[str]) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout))


def roots(names: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in names}


def test_pure_modules_import_no_database_slack_or_http_library() -> None:
    loaded = imported_in_fresh_interpreter(PURE)
    assert set(PURE) <= loaded, "the probe really imported the pure modules"
    assert not roots(loaded) & set(FORBIDDEN), sorted(roots(loaded) & set(FORBIDDEN))
    assert not {name for name in loaded if name in ("bot", "engine.store", "engine.runner")}


def test_the_probe_sees_a_forbidden_import() -> None:
    """Guard against a probe that always passes: the store does pull in sqlalchemy."""
    assert "sqlalchemy" in roots(imported_in_fresh_interpreter(["engine.store"]))


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


ENGINE_FILES = sorted(ENGINE.rglob("*.py"))


@pytest.mark.parametrize("path", ENGINE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_never_imports_bot_or_slack(path: Path) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for line, name in imports_of(path)
        if name.partition(".")[0] == "bot" or name.startswith("slack")
    ]
    assert not bad, bad


def test_engine_scan_finds_the_engine() -> None:
    names = {p.name for p in ENGINE_FILES}
    assert {"events.py", "state.py", "base.py", "sqlite.py", "postgres.py", "runner.py"} <= names
    assert "engine.errors" in {name for _, name in imports_of(ENGINE / "state.py")}
