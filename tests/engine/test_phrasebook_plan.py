"""The phrasebook's run of three steps (``look into api``): one plan of three task cards
in local mode, and its crash variant, whose health check kills opsloop itself once."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from engine import events as ev
from engine.models.phrasebook import GET_SERVICE, ONCALL, PHRASEBOOK
from tests.engine import test_phrasebook as pb
from tests.engine.test_phrasebook import decide, final_text, ran, tool_result
from tests.support.logs import user
from tests.tools.test_demo import ctx
from tools import ToolRegistry

# The phrasebook tests' fixtures: the demo tools, and the registries local mode builds.
demo, registry, demo_registry, local_registry = (
    pb.demo,
    pb.registry,
    pb.demo_registry,
    pb.local_registry,
)

SERVICE = {"structured": {"service": "api", "owner": "platform", "tier": "critical", "replicas": 3}}
ONCALLS = {
    "oncalls": [
        {
            "user": "Bob Chen",
            "email": "bob@opsloop-local.example",
            "schedule": {"id": "P0ONCALL", "name": "Schedule P0ONCALL"},
            "level": 1,
        }
    ],
    "more": False,
}


def _steps(crash: bool) -> list[tuple[str, dict[str, Any], Any]]:
    health: dict[str, Any] = {"service": "api"} | ({"simulate_crash": True} if crash else {})
    answered = {"service": "api", "status": "healthy", "attempt": 2}
    return [
        (GET_SERVICE, {"service": "api"}, SERVICE),
        ("check_health", health, answered),
        (ONCALL, {}, ONCALLS),
    ]


async def _walk(text: str, reg: ToolRegistry, crash: bool) -> str:
    """Each step's call is the next of the three; returns the answer after the last."""
    log: list[ev.Event] = [user(text)]
    for n, (tool, arguments, output) in enumerate(_steps(crash), start=1):
        use = (await decide(log, reg)).tool_use
        assert use is not None and (use.name, use.input) == (tool, arguments), use
        log += [*ran(f"toolu_{n}", tool, "run_now", **arguments), tool_result(f"toolu_{n}", output)]
    return final_text(await decide(log, reg))


async def test_look_into_a_service_makes_three_calls_then_one_answer(local_registry) -> None:
    answer = await _walk("<@U0BOT> look into the api service please", local_registry, False)
    assert answer.splitlines() == [
        "What I found about api:",
        "*api*: owner platform, tier critical, 3 replicas.",
        "api is healthy (answered on attempt 2; the engine retried the failed checks).",
        "On call now, says PagerDuty:",
        "• *Bob Chen* (bob@opsloop-local.example): Schedule P0ONCALL, level 1",
    ]


async def test_with_a_crash_the_health_check_is_asked_to_kill_opsloop(local_registry) -> None:
    answer = await _walk("investigate api and simulate a crash", local_registry, True)
    assert "api is healthy (answered on attempt 2: opsloop was killed during the first" in answer


async def test_a_step_whose_tool_is_missing_says_so(demo_registry) -> None:
    """Without PagerDuty (another opsloop.yaml), the third step explains instead."""
    log: list[ev.Event] = [user("look into api")]
    for n, (tool, arguments, output) in enumerate(_steps(False)[:2], start=1):
        log += [*ran(f"toolu_{n}", tool, "run_now", **arguments), tool_result(f"toolu_{n}", output)]
    answer = final_text(await decide(log, demo_registry))
    assert "`pagerduty_oncall`" in answer and "isn't loaded" in answer


def test_both_phrases_are_in_the_phrasebook() -> None:
    phrases = [p for p, _ in PHRASEBOOK]
    assert {"look into api", "look into api and simulate a crash"} <= set(phrases)


async def test_the_demo_health_check_kills_the_process_on_its_first_attempt_only(
    demo: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Killed(Exception):
        pass

    def kill() -> None:
        raise Killed

    monkeypatch.setattr(demo, "_kill_this_process", kill)
    args = demo.CheckHealthArgs(service="api", simulate_crash=True)
    with pytest.raises(Killed):
        await demo.check_health(args, ctx(attempt=1))
    out = await demo.check_health(args, ctx(attempt=2))  # the restarted process's attempt
    assert (out["status"], out["attempt"]) == ("healthy", 2)
