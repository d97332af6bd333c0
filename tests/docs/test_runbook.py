"""The runbook (docs/operations.md, which the bot quotes through search_docs) and the
README's settings table say what the code does.

A number the runbook gives a setting is written right after its name, in parentheses:
`` `OPSLOOP_LEASE_SECONDS` (30 s) ``; the first number there (with its unit, if any)
must be the setting's default in engine/config.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import get_args

from engine import metrics
from engine.config import ENVIRONMENT, _Environment
from engine.state import Status

ROOT = Path(__file__).resolve().parents[2]
STATUSES: tuple[str, ...] = get_args(Status)
RUNBOOK = ROOT / "docs" / "operations.md"

# Each variable's default, as the code has it (the field its alias names).
DEFAULTS: dict[str, object] = {
    str(f.alias): f.default for f in _Environment.model_fields.values() if f.alias
}
_UNIT_S = {"s": 1, "second": 1, "seconds": 1, "min": 60, "minutes": 60, "h": 3600}
_UNIT_S |= {"hours": 3600, "d": 86400, "day": 86400, "days": 86400}
_NAMES = "|".join(sorted(ENVIRONMENT, key=len, reverse=True))
# `NAME` (…): the parenthesis right after a setting's name.
_STATED = re.compile(rf"`({_NAMES})`\s*\(([^)]*)\)")
_NUMBER = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?:\s*([a-z]+))?")


def _value(name: str, text: str) -> float | None:
    """The first number of ``text`` in the unit of setting ``name`` (seconds for a
    ``…_SECONDS`` one), None when it has none."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    number = float(match.group(1).replace(",", ""))
    unit = match.group(2)
    if unit in _UNIT_S:
        assert name.endswith("_SECONDS"), f"{name}: {text!r} gives a duration"
        return number * _UNIT_S[unit]
    return number


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_each_number_the_runbook_gives_a_setting_is_its_default() -> None:
    text = " ".join(RUNBOOK.read_text(encoding="utf-8").split())
    checked: dict[str, float] = {}
    for name, inside in _STATED.findall(text):
        stated = _value(name, inside)
        if stated is None:
            continue  # "(empty: anyone but the requester)": no number
        default = DEFAULTS[name]
        assert isinstance(default, int | float), f"{name} has no numeric default: ({inside})"
        assert stated == default, f"runbook: `{name}` ({inside}), but the default is {default}"
        checked[name] = stated
    # The numbers the runbook relies on are all written where this test reads them.
    assert {
        "OPSLOOP_LEASE_SECONDS",
        "OPSLOOP_SWEEP_SECONDS",
        "OPSLOOP_APPROVAL_TTL_SECONDS",
        "OPSLOOP_TOOL_TIMEOUT_SECONDS",
        "OPSLOOP_MAX_TOOL_ATTEMPTS",
        "OPSLOOP_MAX_REJECTIONS",
    } <= set(checked)


def test_the_readme_settings_table_gives_the_code_defaults() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = _section(readme, "Configuration")
    checked = set()
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not re.search(r"\d", cells[2]):
            continue
        names = re.findall(r"`([A-Z_]+)`", cells[0])
        # One default per name, in the same order ("10, 10"); a row stating a number
        # must give one for each of its names.
        values = cells[2].split(", ")
        assert len(values) == len(names), f"README row {row!r}: one default per name"
        for name, given in zip(names, values, strict=True):
            default = DEFAULTS[name]
            if isinstance(default, int | float):
                assert _value(name, given) == default, f"README: {name} {given!r} != {default}"
                checked.add(name)
    assert {"OPSLOOP_LEASE_SECONDS", "OPSLOOP_SWEEP_SECONDS", "PORT"} <= checked


def test_the_runbook_says_how_a_crash_is_recovered_as_the_engine_does() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    crashes = " ".join(_section(text, "Restarts and crashes").split())
    # Takeover at the next sweep (engine.workers), not when the lease runs out.
    assert "A process that dies loses its threads at once: the next sweep" in crashes
    # A non-idempotent call cut off is not run again by itself (engine.runner._execute).
    assert "`awaiting_reconcile`" in crashes and "reconcile card" in crashes
    for choice in ("It happened", "Run it again", "It did not happen"):
        assert f"**{choice}**" in crashes
    assert "awaiting_reconcile" in STATUSES
    rollback = " ".join(_section(text, "Rolling back a deploy").split())
    assert "quorum" in rollback and "`quorum: 2`" in rollback


def test_every_metric_the_runbook_names_is_exported() -> None:
    text = _section(RUNBOOK.read_text(encoding="utf-8"), "Reading /metrics")
    named = set(re.findall(r"\bopsloop_[a-z_]+[a-z]", text))
    families = metrics.store_families({}, None, datetime.now(UTC), STATUSES)
    families += metrics.mcp_families([("kube", True, 3, 0)])  # with an MCP server
    exposition = metrics.scrape(families).decode()
    exported = set()
    for family in re.findall(r"^# TYPE (\S+) ", exposition, flags=re.MULTILINE):
        exported |= {family, *(family + s for s in ("_total", "_bucket", "_sum", "_count"))}
    assert len(named) >= 8
    assert named <= exported, f"not exported: {sorted(named - exported)}"
