"""What every renderer keeps: untrusted text escaped, Slack's limits, no I/O."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot import limits
from bot.render.notification import fallback_text
from tests.bot.render.support import (
    EVIL,
    RENDERERS,
    WEIRD,
    assert_safe,
    every_rendering,
    sdk_validate,
    text_objects,
)

ROOT = Path(__file__).resolve().parents[3]
EVIL_RENDERINGS = list(every_rendering(EVIL, intent=EVIL))


@pytest.mark.parametrize(
    "rendering",
    [r for _, r in EVIL_RENDERINGS],
    ids=[f"{i}-{name}" for i, (name, _) in enumerate(EVIL_RENDERINGS)],
)
def test_untrusted_text_never_pings_or_links(rendering: Any) -> None:
    dumped = json.dumps(rendering, ensure_ascii=False)
    for raw in ("<!channel>", "<@U999>", "<https://evil.example", "& stuff"):
        assert raw not in dumped
    for text in text_objects(rendering):
        assert_safe(text)
    if not isinstance(rendering, dict):
        assert_safe(fallback_text(rendering))


def test_the_untrusted_text_is_shown_escaped() -> None:
    carrying = [
        name
        for name, rendering in EVIL_RENDERINGS
        if any("&lt;!channel&gt; &lt;@U999&gt;" in t for t in text_objects(rendering))
    ]
    assert len(carrying) >= 30, carrying


HUGE_ARGS = {
    "blob": "<&>" * 34_000,
    "rows": [{"id": i, "note": "ü" * 50} for i in range(300)],
    "nested": {"a": {"b": {"c": ["```"] * 100}}},
}


OVERSIZED = [
    ("100 KB arguments", "short", HUGE_ARGS, "refund_customer"),
    ("20,000-character texts", "y" * 20_000, None, "refund_customer"),
    ("300-character tool name", "short", None, "t" * 300),
    ("weird unicode", WEIRD * 400, {WEIRD: WEIRD * 200}, WEIRD * 20),
    ("escaping blow-up", "<" * 20_000, {"x": "&" * 30_000}, "<" * 300),
    ("empty texts", "", {}, "x"),
]


@pytest.mark.parametrize(
    ("text", "args", "intent"), [o[1:] for o in OVERSIZED], ids=[o[0] for o in OVERSIZED]
)
def test_every_renderer_keeps_slacks_limits(text: str, args: Any, intent: str) -> None:
    renderings = list(every_rendering(text, args, intent))
    assert len(renderings) > 30
    for name, rendering in renderings:
        assert limits.check_limits(rendering) == [], name
        sdk_validate(rendering)
        if not isinstance(rendering, dict):
            assert len(fallback_text(rendering)) <= 3000


def test_rendering_modules_do_no_io_and_import_no_slack_library() -> None:
    assert len(RENDERERS) >= 8, RENDERERS  # the probe below really covers the package
    code = (
        f"import json, sys\nimport {', '.join(RENDERERS)}, bot.limits, bot.mrkdwn\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(out.stdout))
    roots = {name.partition(".")[0] for name in loaded}
    forbidden = {
        "slack_sdk",
        "slack_bolt",
        "aiohttp",
        "sqlalchemy",
        "sqlmodel",
        "asyncpg",
        "aiosqlite",
        "anthropic",
        "apscheduler",
    }
    assert not roots & forbidden, sorted(roots & forbidden)
    assert set(RENDERERS) <= loaded
    assert not loaded & {"engine.store", "engine.runner", "bot.cli"}
