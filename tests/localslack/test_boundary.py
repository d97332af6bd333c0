"""The local Slack meets the bot only on the wire: ``localslack`` imports nothing of
``bot`` (nor an app's Slack SDK), and ``bot`` reaches ``localslack`` only from the one
module that puts both on one port for ``opsloop local``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.test_purity import imported_in_fresh_interpreter, imports_of

ROOT = Path(__file__).resolve().parents[2]
WIRING = ROOT / "bot" / "local_mode.py"
LOCALSLACK_FILES = sorted((ROOT / "localslack").rglob("*.py"))
BOT_FILES = sorted((ROOT / "bot").rglob("*.py"))
MODULES = [
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in LOCALSLACK_FILES
]


def _root(name: str) -> str:
    return name.partition(".")[0]


def test_importing_all_of_localslack_loads_no_bot_and_no_slack_sdk() -> None:
    loaded = imported_in_fresh_interpreter(MODULES)
    assert set(MODULES) <= loaded, "the probe really imported every module"
    leaked = {n for n in loaded if _root(n) in ("bot", "slack_sdk", "slack_bolt")}
    assert not leaked, sorted(leaked)


@pytest.mark.parametrize("path", LOCALSLACK_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_localslack_module_imports_bot_even_lazily(path: Path) -> None:
    bad = [f"{line}: {name}" for line, name in imports_of(path) if _root(name) == "bot"]
    assert not bad, bad


def test_bot_imports_localslack_only_from_the_local_mode_wiring() -> None:
    importers = {
        str(path.relative_to(ROOT))
        for path in BOT_FILES
        for _, name in imports_of(path)
        if _root(name) == "localslack"
    }
    assert importers == {str(WIRING.relative_to(ROOT))}


def test_the_probe_sees_bot_when_the_wiring_is_imported() -> None:
    """Guard against a probe that always passes: the wiring does load the bot."""
    loaded = imported_in_fresh_interpreter(["bot.local_mode"])
    assert {"bot.runtime", "localslack.server"} <= loaded
