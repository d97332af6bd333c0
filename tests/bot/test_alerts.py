"""``POST /alerts/{alertmanager|pagerduty|generic}`` through the real HTTP app, on SQLite
and PostgreSQL: authenticated requests open (or continue) one thread per alert; bad
signatures 401, malformed bodies 400, disabled sources 404, and nothing stored for any
of them, never a 500."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bot.alerts import (
    PAGERDUTY_HEADER,
    RETRY_AFTER_S,
    TeamUnknown,
    add_alert_routes,
    generic_signature,
    pagerduty_signature,
)
from bot.hooks import MAX_BODY, SIGNATURE_HEADER, TIMESTAMP_HEADER
from bot.hooks import signature as hook_signature
from engine.config_file import ConfigFile, parse_config
from engine.errors import StoreUnavailable
from engine.store import Store
from tests.engine.test_alerts import ALERTMANAGER, PAGERDUTY, pagerduty

TEAM = "T0ALERTS"
AM_TOKEN = "am-token-6f1e"
PD_SECRET = "pd-secret-92ab"
GENERIC_SECRET = "generic-secret-0d4c"
CONFIG = f"""
integrations:
  pagerduty:
    token: pd-api-token
    webhook_secret: {PD_SECRET}
alerts:
  alertmanager:
    channel: C0ALERTS
    token: {AM_TOKEN}
    instruction: Investigate with read-only tools and summarise. Do not act.
  pagerduty:
    channel: C0PAGES
  generic:
    channel: C0OPS
    secret: {GENERIC_SECRET}
    instruction: Summarise the alert and suggest a next step.
"""
GENERIC = {
    "fingerprint": "disk-full/db-1",
    "status": "firing",
    "summary": "Disk 95% full on db-1",
    "labels": {"host": "db-1"},
    "url": "https://grafana.example/d/disk",
}


def config(text: str = CONFIG) -> ConfigFile:
    return parse_config(text, {})


class Kicks(list[str]):
    def __call__(self, thread_id: str) -> None:
        self.append(thread_id)


async def team() -> str:
    return TEAM


def bearer(token: str = AM_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def pd_signed(body: bytes, secret: str = PD_SECRET) -> dict[str, str]:
    return {PAGERDUTY_HEADER: pagerduty_signature(secret, body)}


def generic_signed(
    body: bytes, secret: str = GENERIC_SECRET, at: float | None = None
) -> dict[str, str]:
    stamp = str(int(at or time.time()))
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: generic_signature(secret, stamp, body)}


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.fixture
async def client(store: Store) -> AsyncIterator[tuple[TestClient, Kicks]]:
    kicks = Kicks()
    app = web.Application()
    add_alert_routes(app, store, config(), team, kicks)
    async with TestClient(TestServer(app)) as c:
        yield c, kicks


async def answer(resp: Any) -> tuple[int, dict[str, Any]]:
    return resp.status, await resp.json()


async def nothing_stored(store: Store) -> None:
    assert await store.list_threads() == []


# --- Alertmanager -----------------------------------------------------------------------


async def test_alertmanager_opens_a_thread_per_firing_alert(store, client) -> None:
    c, kicks = client
    status, body = await answer(
        await c.post("/alerts/alertmanager", data=dumps(ALERTMANAGER), headers=bearer())
    )
    assert status == 200 and body["ok"]
    firing, resolved = body["alerts"]
    assert (firing["fingerprint"], firing["result"]) == ("5b9b5a2e3c1f0a7d", "stored")
    # Resolved with no thread open for it: nothing to say it in.
    assert (resolved["fingerprint"], resolved["result"]) == ("0c2e8f6d5a4b3c21", "ignored")
    [info] = await store.list_threads()
    assert (info.id, info.team, info.channel, info.status) == (
        firing["thread_id"],
        TEAM,
        "C0ALERTS",
        "running",
    )
    assert kicks == [info.id]
    [event] = await store.select_events(info.id)
    assert (event.type, event.actor) == ("alert_received", "alert:alertmanager")
    assert event.instruction == "Investigate with read-only tools and summarise. Do not act."  # type: ignore[union-attr]

    # Alertmanager repeats the notification (repeat_interval, or a retry): nothing new.
    again = await c.post("/alerts/alertmanager", data=dumps(ALERTMANAGER), headers=bearer())
    assert (await again.json())["alerts"][0]["result"] == "duplicate"
    assert kicks == [info.id] and len(await store.select_events(info.id)) == 1

    # It resolves: appended to the same thread.
    done = copy.deepcopy(ALERTMANAGER)
    done["alerts"] = [dict(ALERTMANAGER["alerts"][0], status="resolved")]
    resp = await c.post("/alerts/alertmanager", data=dumps(done), headers=bearer())
    assert (await resp.json())["alerts"][0] == {
        "fingerprint": "5b9b5a2e3c1f0a7d",
        "thread_id": info.id,
        "result": "stored",
    }
    assert [e.type for e in await store.select_events(info.id)] == ["alert_received"] * 2
    assert await store.find_alert_thread("alertmanager:5b9b5a2e3c1f0a7d") is None


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {AM_TOKEN}"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {AM_TOKEN}x"},
    ],
)
async def test_alertmanager_without_its_token_is_refused(store, client, headers) -> None:
    c, kicks = client
    resp = await c.post("/alerts/alertmanager", data=dumps(ALERTMANAGER), headers=headers)
    assert resp.status == 401 and "error" in await resp.json()
    await nothing_stored(store)
    assert kicks == []


async def test_a_repeated_authorization_header_is_refused(store, client) -> None:
    c, _ = client
    headers = [("Authorization", f"Bearer {AM_TOKEN}"), ("Authorization", "Bearer other")]
    resp = await c.post("/alerts/alertmanager", data=dumps(ALERTMANAGER), headers=headers)
    assert resp.status == 401
    await nothing_stored(store)


# --- PagerDuty ---------------------------------------------------------------------------


async def test_pagerduty_signed_events_open_and_resolve_the_incident_s_thread(
    store, client
) -> None:
    c, kicks = client
    body = dumps(PAGERDUTY)
    status, got = await answer(
        await c.post("/alerts/pagerduty", data=body, headers=pd_signed(body))
    )
    assert status == 200
    [opened] = got["alerts"]
    thread_id = opened["thread_id"]
    assert (await store.get_thread(thread_id)).channel == "C0PAGES"
    # Acknowledged: none of ours, nothing stored; PagerDuty gets its 2xx.
    ack = dumps(pagerduty("incident.acknowledged", "01DEN5ACK"))
    assert (await answer(await c.post("/alerts/pagerduty", data=ack, headers=pd_signed(ack)))) == (
        200,
        {"ok": True, "alerts": []},
    )
    # Resolved, signed with two secrets while PagerDuty rotates them: one match will do.
    resolved = dumps(pagerduty("incident.resolved", "01DEN6RES"))
    both = {PAGERDUTY_HEADER: f"{pagerduty_signature('old', resolved)}, "
            f"{pagerduty_signature(PD_SECRET, resolved)}"}  # fmt: skip
    status, got = await answer(await c.post("/alerts/pagerduty", data=resolved, headers=both))
    assert status == 200 and got["alerts"][0]["thread_id"] == thread_id
    events = await store.select_events(thread_id)
    assert [(e.type, e.status) for e in events] == [  # type: ignore[union-attr]
        ("alert_received", "firing"),
        ("alert_received", "resolved"),
    ]
    assert kicks == [thread_id, thread_id]


@pytest.mark.parametrize(
    "signature",
    [
        None,
        "v1=" + "0" * 64,
        "v0=" + "0" * 64,
        "v1=nothex",
        "sha256=abc",
        "",
    ],
)
async def test_pagerduty_without_a_matching_signature_is_refused(store, client, signature) -> None:
    c, _ = client
    body = dumps(PAGERDUTY)
    headers = {} if signature is None else {PAGERDUTY_HEADER: signature}
    assert (await c.post("/alerts/pagerduty", data=body, headers=headers)).status == 401
    # Signed, but for another body: refused too.
    other = pd_signed(dumps(pagerduty("incident.resolved")))
    assert (await c.post("/alerts/pagerduty", data=body, headers=other)).status == 401
    await nothing_stored(store)


# --- generic ------------------------------------------------------------------------------


async def test_a_generic_alert_signed_like_hooks_opens_a_thread_once(store, client) -> None:
    c, kicks = client
    body = dumps(GENERIC)
    headers = generic_signed(body)
    status, got = await answer(await c.post("/alerts/generic", data=body, headers=headers))
    assert status == 200 and got["alerts"][0]["result"] == "stored"
    # The same signed request again (a retried delivery): stored once.
    status, got = await answer(await c.post("/alerts/generic", data=body, headers=headers))
    assert got["alerts"][0]["result"] == "duplicate"
    [info] = await store.list_threads()
    assert info.channel == "C0OPS" and len(await store.select_events(info.id)) == 1
    assert kicks == [info.id]


async def test_a_generic_alert_with_a_bad_signature_is_refused(store, client) -> None:
    c, _ = client
    body = dumps(GENERIC)
    stamp = str(int(time.time()))
    refused = [
        {},
        generic_signed(body, secret="wrong"),
        generic_signed(body, at=time.time() - 3600),  # stale
        generic_signed(dumps({**GENERIC, "summary": "other"})),  # another body
        # A /hooks signature with the same secret: the route is signed in, so no.
        {
            TIMESTAMP_HEADER: stamp,
            SIGNATURE_HEADER: hook_signature(GENERIC_SECRET, stamp, "x", body),
        },
    ]
    for headers in refused:
        assert (await c.post("/alerts/generic", data=body, headers=headers)).status == 401
    await nothing_stored(store)


# --- what is refused whoever sends it ------------------------------------------------------


async def test_a_source_that_is_not_enabled_or_not_known_is_404(store) -> None:
    app = web.Application()
    only = config(f"alerts:\n  alertmanager:\n    channel: C0ALERTS\n    token: {AM_TOKEN}\n")
    add_alert_routes(app, store, only, team, Kicks())
    async with TestClient(TestServer(app)) as c:
        body = dumps(GENERIC)
        resp = await c.post("/alerts/generic", data=body, headers=generic_signed(body))
        assert resp.status == 404 and "not enabled" in (await resp.json())["error"]
        assert (await c.post("/alerts/nagios", data=b"{}")).status == 404
        pd = dumps(PAGERDUTY)
        assert (await c.post("/alerts/pagerduty", data=pd, headers=pd_signed(pd))).status == 404
    app = web.Application()
    add_alert_routes(app, store, None, team, Kicks())  # no opsloop.yaml at all
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/alerts/alertmanager", data=dumps(ALERTMANAGER), headers=bearer())
        assert resp.status == 404
    await nothing_stored(store)


def _deep(n: int) -> bytes:
    return b'{"version": "4", "alerts": ' + b"[" * n + b"]" * n + b"}"


HOSTILE_BODIES = [
    b"",
    b"not json",
    b"\xff\xfe\x00garbage",
    b"[1, 2, 3]",
    b'"a string"',
    b"null",
    _deep(100_000),
    dumps({"version": "4", "alerts": "all of them"}),
    dumps({"version": "4", "alerts": [{"status": "firing"}]}),
    dumps({"version": 4, "alerts": []}),
    dumps({**ALERTMANAGER, "alerts": [{**ALERTMANAGER["alerts"][0], "labels": {"a": None}}]}),
    dumps({**ALERTMANAGER, "alerts": [{**ALERTMANAGER["alerts"][0], "labels": [1]}]}),
    # One good alert and one bad: the whole body is refused, the good one not stored.
    dumps({**ALERTMANAGER, "alerts": [ALERTMANAGER["alerts"][0], {"status": "x"}]}),
]


@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
async def test_a_malformed_body_is_400_and_stores_nothing(store, client, body) -> None:
    c, kicks = client
    resp = await c.post("/alerts/alertmanager", data=body, headers=bearer())
    assert resp.status == 400, await resp.text()
    assert "error" in await resp.json()
    await nothing_stored(store)
    assert kicks == []


@pytest.mark.parametrize("source", ["pagerduty", "generic"])
async def test_malformed_bodies_of_the_other_sources_are_400(store, client, source) -> None:
    c, _ = client
    sign = pd_signed if source == "pagerduty" else generic_signed
    for body in [b"not json", b"[]", dumps({"event": "x"}), dumps({"fingerprint": 1})]:
        resp = await c.post(f"/alerts/{source}", data=body, headers=sign(body))
        assert resp.status == 400, (body, await resp.text())
    await nothing_stored(store)


async def test_a_body_over_the_limit_is_413_without_being_read_whole(store, client) -> None:
    c, _ = client
    huge = b'{"version": "4", "alerts": [], "pad": "' + b"x" * MAX_BODY + b'"}'
    assert (await c.post("/alerts/alertmanager", data=huge, headers=bearer())).status == 413

    async def trickle() -> AsyncIterator[bytes]:  # no Content-Length: chunked
        for _ in range(MAX_BODY // 65536 + 2):
            yield b" " * 65536

    resp = await c.post("/alerts/alertmanager", data=trickle(), headers=bearer())
    assert resp.status == 413
    await nothing_stored(store)


async def test_unreachable_slack_or_database_is_503_and_the_sender_retries(store) -> None:
    async def no_team() -> str:
        raise TeamUnknown("auth.test failed: ClientConnectorError")

    app = web.Application()
    add_alert_routes(app, store, config(), no_team, Kicks())
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/alerts/alertmanager", data=dumps(ALERTMANAGER), headers=bearer())
        assert resp.status == 503 and resp.headers["Retry-After"] == str(RETRY_AFTER_S)
    await nothing_stored(store)

    async def down(*args: Any, **kw: Any) -> Any:
        raise StoreUnavailable("cannot reach the database: gone")

    app = web.Application()
    add_alert_routes(app, store, config(), team, Kicks())
    store.find_alert_thread = down  # type: ignore[method-assign]
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/alerts/alertmanager", data=dumps(ALERTMANAGER), headers=bearer())
        assert resp.status == 503 and "database" in (await resp.json())["error"]


async def test_two_deliveries_of_a_new_alert_at_once_open_one_thread(store, client) -> None:
    c, kicks = client
    later = copy.deepcopy(ALERTMANAGER)
    later["alerts"][0]["annotations"]["description"] = "now 2.6s"  # the same delivery
    bodies = [dumps(ALERTMANAGER), dumps(later), dumps(ALERTMANAGER), dumps(later)]
    answers = await asyncio.gather(
        *(c.post("/alerts/alertmanager", data=b, headers=bearer()) for b in bodies)
    )
    assert [r.status for r in answers] == [200] * 4
    results = [(await r.json())["alerts"][0] for r in answers]
    assert len({r["thread_id"] for r in results}) == 1
    assert sorted(r["result"] for r in results) == ["duplicate"] * 3 + ["stored"]
    [info] = await store.list_threads()
    assert len(await store.select_events(info.id)) == 1 and kicks == [info.id]
