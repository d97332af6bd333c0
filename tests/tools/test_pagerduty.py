"""The PagerDuty tools and their client, against a wire-level fake PagerDuty."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from bot.configured import tool_sources
from engine.config_file import parse_config
from tests.fakes.pagerduty import ACCEPT, FROM_EMAIL, TOKEN, FakePagerDuty
from tools import ToolContext
from tools.errors import RetryableToolError, ToolError
from tools.integrations.config import PagerDutyConfig
from tools.integrations.pagerduty import IncidentArgs, PagerDutySource, note_marker
from tools.integrations.pagerduty_client import PagerDutyClient
from tools.registry import Tool

CTX = ToolContext(
    thread_id="thr_1", tool_call_id="toolu_1", idempotency_key="thr_1:toolu_1", attempt=1
)
INCIDENT = "Q0INCIDENT1"


@pytest.fixture
async def pd() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty() as fake:
        fake.add_user("PALICE1", "Alice", "alice@acme.example")
        fake.add_user("PBOT0001", "Ops bot", FROM_EMAIL)
        fake.add_incident(INCIDENT, "API 5xx above 2%")
        yield fake


def config(pd: FakePagerDuty, **more: Any) -> PagerDutyConfig:
    values: dict[str, Any] = {"token": SecretStr(TOKEN), "api_url": pd.url}
    values["from_email"] = FROM_EMAIL
    return PagerDutyConfig(**values | more)


@pytest.fixture
async def tools(pd: FakePagerDuty) -> AsyncIterator[dict[str, Tool]]:
    source = PagerDutySource(config(pd))
    try:
        yield {t.name: t for t in await source.open()}
    finally:
        await source.close()


async def run(tools: dict[str, Tool], name: str, ctx: ToolContext = CTX, **args: Any) -> Any:
    tool = tools[name]
    return await tool.run(tool.parse_arguments(args), ctx)


# --- the source ------------------------------------------------------------------------------


async def test_the_file_names_the_source_and_its_tools_have_their_default_policies() -> None:
    text = "integrations:\n  pagerduty:\n    token: ${PAGERDUTY_TOKEN}\n"
    [source] = tool_sources(parse_config(text, {"PAGERDUTY_TOKEN": "t"}))
    assert isinstance(source, PagerDutySource) and source.key == "integrations.pagerduty"
    opened = {t.name: t for t in await source.open()}
    await source.close()
    assert {n: t.policy for n, t in opened.items()} == {
        "pagerduty_oncall": "run_now",
        "pagerduty_incidents": "run_now",
        "pagerduty_add_note": "approve_before_run",
        "pagerduty_acknowledge": "approve_before_run",
        "pagerduty_resolve": "approve_before_run",
    }
    assert all(t.idempotent and t.source == "pagerduty" for t in opened.values())


def test_an_id_cannot_reach_another_endpoint() -> None:
    for bad in ("../users", "Q1?x=1", "", "Q1/notes"):
        with pytest.raises(ValidationError):
            IncidentArgs(incident_id=bad)


# --- reading ---------------------------------------------------------------------------------


async def test_who_is_on_call_is_asked_with_the_token_at_the_configured_api_url(
    pd: FakePagerDuty, tools: dict[str, Tool]
) -> None:
    pd.put_on_call(["PALICE1"], schedule="PSCHED01")
    result = await run(tools, "pagerduty_oncall", schedule_id="PSCHED01")
    [entry] = result["oncalls"]
    assert entry["user"] == "Alice" and entry["email"] == "alice@acme.example"
    assert entry["schedule"] == {"id": "PSCHED01", "name": "Schedule PSCHED01"}
    assert entry["level"] == 1 and result["more"] is False
    [call] = pd.calls_to("GET", "/oncalls")
    assert call.headers["Authorization"] == f"Token token={TOKEN}"
    assert call.headers["Accept"] == ACCEPT
    assert ("schedule_ids[]", "PSCHED01") in call.query and ("include[]", "users") in call.query
    assert "From" not in call.headers  # only writes say who acts


async def test_the_open_incidents_come_newest_first_and_one_comes_with_its_notes(
    pd: FakePagerDuty, tools: dict[str, Tool]
) -> None:
    pd.add_incident("Q0INCIDENT2", "Disk full on db-1", status="acknowledged")
    pd.add_incident("Q0INCIDENT3", "Old one", status="resolved")
    listed = await run(tools, "pagerduty_incidents")
    assert [i["id"] for i in listed["incidents"]] == ["Q0INCIDENT2", INCIDENT]
    assert listed["incidents"][0]["status"] == "acknowledged"
    assert listed["incidents"][0]["url"].endswith("/incidents/Q0INCIDENT2")
    await run(tools, "pagerduty_add_note", incident_id=INCIDENT, content="Rolled back api.")
    one = await run(tools, "pagerduty_incidents", incident_id=INCIDENT)
    assert one["incident"]["title"] == "API 5xx above 2%"
    assert [n["content"].splitlines()[0] for n in one["notes"]] == ["Rolled back api."]


async def test_pagerduty_down_is_retryable_and_a_refusal_is_an_error_without_the_token(
    pd: FakePagerDuty,
) -> None:
    source = PagerDutySource(config(pd, token=SecretStr("wrong-token")))
    tools = {t.name: t for t in await source.open()}
    try:
        with pytest.raises(ToolError) as refused:
            await run(tools, "pagerduty_incidents")
        assert not isinstance(refused.value, RetryableToolError)
        assert "HTTP 401 (Unauthorized)" in str(refused.value)
        assert "wrong-token" not in str(refused.value)
    finally:
        await source.close()
    async with FakePagerDuty() as down:
        down.fail("GET", "/oncalls", 503)
        source = PagerDutySource(config(down))
        tools = {t.name: t for t in await source.open()}
        try:
            with pytest.raises(RetryableToolError, match="HTTP 503"):
                await run(tools, "pagerduty_oncall")
        finally:
            await source.close()


# --- writing, idempotently -------------------------------------------------------------------


async def test_a_note_carries_its_calls_marker_and_is_added_once(
    pd: FakePagerDuty, tools: dict[str, Tool]
) -> None:
    first = await run(tools, "pagerduty_add_note", incident_id=INCIDENT, content="Rolled back.")
    again = await run(tools, "pagerduty_add_note", incident_id=INCIDENT, content="Rolled back.")
    assert first["added"] is True and again == first | {"added": False}
    [note] = pd.incidents[INCIDENT].notes
    assert note["content"] == f"Rolled back.\n\n{note_marker(CTX.idempotency_key)}"
    [post] = pd.calls_to("POST", "/incidents/{id}/notes")
    assert post.headers["From"] == FROM_EMAIL
    other = ToolContext("thr_1", "toolu_2", "thr_1:toolu_2", 1)
    assert (await run(tools, "pagerduty_add_note", other, incident_id=INCIDENT, content="x"))[
        "added"
    ]
    assert len(pd.incidents[INCIDENT].notes) == 2  # another call is another note


async def test_a_note_whose_answer_was_lost_is_found_by_the_retry_not_added_twice(
    pd: FakePagerDuty,
) -> None:
    pd.hold("POST", "/incidents/{id}/notes")  # added, but the answer never comes
    client = PagerDutyClient(config(pd), timeout=0.5)
    source = PagerDutySource(config(pd), client=client)
    tools = {t.name: t for t in await source.open()}
    try:
        with pytest.raises(RetryableToolError):
            await run(tools, "pagerduty_add_note", incident_id=INCIDENT, content="Restarted.")
        assert len(pd.incidents[INCIDENT].notes) == 1
        retry = ToolContext(CTX.thread_id, CTX.tool_call_id, CTX.idempotency_key, attempt=2)
        again = await run(tools, "pagerduty_add_note", retry, incident_id=INCIDENT, content="x")
        assert again["added"] is False
        assert len(pd.incidents[INCIDENT].notes) == 1
        assert len(pd.calls_to("POST", "/incidents/{id}/notes")) == 1
    finally:
        await source.close()
        await client.close()


async def test_acknowledging_or_resolving_twice_is_harmless(
    pd: FakePagerDuty, tools: dict[str, Tool]
) -> None:
    acked = await run(tools, "pagerduty_acknowledge", incident_id=INCIDENT)
    assert acked["changed"] is True and acked["status"] == "acknowledged"
    assert (await run(tools, "pagerduty_acknowledge", incident_id=INCIDENT))["changed"] is False
    [put] = pd.calls_to("PUT", "/incidents/{id}")
    assert put.body == {"incident": {"type": "incident_reference", "status": "acknowledged"}}
    assert put.headers["From"] == FROM_EMAIL
    done = await run(tools, "pagerduty_resolve", incident_id=INCIDENT, resolution="Rolled back")
    assert done["changed"] is True and pd.incidents[INCIDENT].resolution == "Rolled back"
    assert (await run(tools, "pagerduty_resolve", incident_id=INCIDENT))["changed"] is False
    # Acknowledging what is resolved changes nothing either (PagerDuty would refuse it).
    late = await run(tools, "pagerduty_acknowledge", incident_id=INCIDENT)
    assert late == {"incident_id": INCIDENT, "status": "resolved", "changed": False} | {
        "url": late["url"]
    }
    assert len(pd.calls_to("PUT", "/incidents/{id}")) == 2


async def test_a_write_without_a_from_email_pagerduty_accepts_is_an_error(
    pd: FakePagerDuty,
) -> None:
    source = PagerDutySource(config(pd, from_email="nobody@acme.example"))
    tools = {t.name: t for t in await source.open()}
    try:
        with pytest.raises(ToolError, match="Requester User Not Found"):
            await run(tools, "pagerduty_acknowledge", incident_id=INCIDENT)
    finally:
        await source.close()
    assert pd.incidents[INCIDENT].status == "triggered"


async def test_an_unknown_incident_is_an_error_the_model_reads(tools: dict[str, Tool]) -> None:
    with pytest.raises(ToolError, match="HTTP 404"):
        await run(tools, "pagerduty_resolve", incident_id="Q0NOSUCH")
