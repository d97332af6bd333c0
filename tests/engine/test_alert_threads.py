"""An alert's thread in the store, on SQLite and PostgreSQL: one open thread per alert
(``receive_alert`` and the unique index ``uq_threads_alert``), found by its fingerprint
until it resolves, its placeholder root moved to the bot's post, and revision 0006."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from engine import events as ev
from engine.alerts import is_pending_root
from engine.db import create_engine, parse_database_url
from engine.inputs import Accepted, Refused, post_user_message, receive_alert
from engine.migrations import inspect_schema, migrate
from engine.schema import HEAD
from engine.store import Store, ThreadKey, open_store
from tests.support.logs import alert

TEAM = "T0ALERTS"
KEY = "alertmanager:5b9b5a2e3c1f0a7d"


def delivered(status: str = "firing", n: int = 1, **kw: object) -> ev.AlertReceived:
    """The alert's ``n``th notification (each its own delivery)."""
    return alert(status, dedupe_key=f"alert:alertmanager:{status}:{n}", **kw)  # type: ignore[arg-type]


async def accepted(store: Store, event: ev.AlertReceived) -> Accepted:
    done = await receive_alert(store, event, team=TEAM)
    assert isinstance(done, Accepted), done
    return done


async def types(store: Store, thread_id: str) -> list[str]:
    return [e.type for e in await store.select_events(thread_id)]


async def test_a_firing_alert_opens_a_thread_at_a_placeholder_root(store: Store) -> None:
    done = await accepted(store, delivered())
    info = await store.get_thread(done.thread_id)
    assert (info.team, info.channel, info.status) == (TEAM, "C0ALERTS", "running")
    assert is_pending_root(info.root_ts)
    assert await store.find_alert_thread(KEY) == done.thread_id
    assert (await store.load(done.thread_id)).alert == KEY


async def test_a_resend_is_a_no_op_and_a_new_notification_appends(store: Store) -> None:
    first = await accepted(store, delivered())
    again = await accepted(store, delivered())
    assert again.deduplicated and again.thread_id == first.thread_id
    later = await accepted(store, delivered(n=2, summary="still high"))
    assert not later.deduplicated and later.thread_id == first.thread_id
    assert await types(store, first.thread_id) == ["alert_received", "alert_received"]


async def test_an_answered_thread_still_takes_its_alert(store: Store) -> None:
    first = await accepted(store, delivered())
    state = await store.load(first.thread_id)
    answer = [
        ev.ModelDecision(actor="model", text="looked", stop_reason="end_turn"),
        ev.FinalAnswer(actor="model", text="looked"),
    ]
    await store.append(first.thread_id, state.last_seq, answer, state=state)
    assert (await store.get_thread(first.thread_id)).status == "idle"
    again = await accepted(store, delivered(n=2))
    assert again.thread_id == first.thread_id
    assert (await store.get_thread(first.thread_id)).status == "running"  # reopened


async def test_a_resolution_appends_and_a_later_firing_opens_a_new_thread(store: Store) -> None:
    first = await accepted(store, delivered())
    resolved = await accepted(store, delivered("resolved"))
    assert resolved.thread_id == first.thread_id
    assert await store.find_alert_thread(KEY) is None  # closed: the column is NULL
    assert (await store.get_thread(first.thread_id)).status == "running"  # nobody woken
    again = await receive_alert(store, delivered("resolved"), team=TEAM)
    assert isinstance(again, Refused)  # resent after the thread closed: nowhere to go
    later = await accepted(store, delivered(n=3))
    assert later.thread_id != first.thread_id
    assert await store.find_alert_thread(KEY) == later.thread_id
    assert await types(store, first.thread_id) == ["alert_received", "alert_received"]


async def test_a_resolution_without_an_open_thread_stores_nothing(store: Store) -> None:
    done = await receive_alert(store, delivered("resolved"), team=TEAM)
    assert isinstance(done, Refused) and "no thread is open" in done.reason
    assert await store.list_threads() == []


async def test_other_fingerprints_have_threads_of_their_own(store: Store) -> None:
    one = await accepted(store, delivered())
    two = await accepted(store, delivered(fingerprint="0c2e8f6d5a4b3c21"))
    assert one.thread_id != two.thread_id


@pytest.mark.parametrize("same_delivery", [False, True])
async def test_deliveries_racing_to_open_a_thread_open_one(
    db_url: str, same_delivery: bool
) -> None:
    """Two processes (two stores) each get the new alert at once, several times: one
    thread; every distinct delivery in it once."""
    stores = [await open_store(db_url), await open_store(db_url)]
    try:
        events = [
            delivered(n=1 if same_delivery else i) for i in range(6)
        ]  # same_delivery: Alertmanager retrying one notification
        results = await asyncio.gather(
            *(receive_alert(stores[i % 2], e, team=TEAM) for i, e in enumerate(events))
        )
        assert all(isinstance(r, Accepted) for r in results)
        threads = {r.thread_id for r in results if isinstance(r, Accepted)}
        assert len(threads) == 1
        [thread_id] = threads
        assert [t.id for t in await stores[0].list_threads()] == [thread_id]
        stored = await types(stores[0], thread_id)
        assert stored == ["alert_received"] * (1 if same_delivery else 6)
    finally:
        for s in stores:
            await s.close()


async def test_the_root_moves_to_the_post_once_and_replies_find_the_thread(store: Store) -> None:
    done = await accepted(store, delivered())
    pending = (await store.get_thread(done.thread_id)).root_ts
    assert await store.set_root(done.thread_id, pending, "1767000011.000100")
    assert not await store.set_root(done.thread_id, pending, "1767000099.000100")  # moved
    key = ThreadKey(TEAM, "C0ALERTS", "1767000011.000100")
    assert await store.find_thread(key) == done.thread_id
    reply = await post_user_message(store, key, text="is it bad?", user="U0ALICE", start=False)
    assert reply.thread_id == done.thread_id
    assert (await store.load(done.thread_id)).requester == "U0ALICE"


# --- revision 0006 ------------------------------------------------------------------------


async def _alert_index(url: str) -> str | None:
    engine = create_engine(parse_database_url(url))
    sql = (
        "SELECT indexdef FROM pg_indexes"
        " WHERE indexname = 'uq_threads_alert' AND schemaname = current_schema()"
        if engine.dialect.name == "postgresql"
        else "SELECT sql FROM sqlite_master WHERE name = 'uq_threads_alert'"
    )
    try:
        async with engine.connect() as conn:
            return (await conn.execute(sa.text(sql))).scalar()
    finally:
        await engine.dispose()


async def test_revision_0006_adds_the_column_and_its_partial_unique_index(db_url: str) -> None:
    """0005 -> 0006, with a store of this release opened on the 0005 database first
    (SQLite creates missing indexes, and this one's column is not there yet)."""
    await migrate(db_url, "0005")
    store = await open_store(db_url)  # not serve: no schema check
    await store.close()
    assert await _alert_index(db_url) is None
    before, after = await migrate(db_url)
    assert (before.revision, after.revision) == ("0005", HEAD)
    index = await _alert_index(db_url)
    assert index is not None and "UNIQUE" in index.upper() and "alert_key" in index
    assert "IS NOT NULL" in index.upper()  # partial: threads without an alert stay out
    assert (await inspect_schema(db_url)).revision == HEAD
    store = await open_store(db_url)
    try:
        done = await accepted(store, delivered())
        assert await store.find_alert_thread(KEY) == done.thread_id
    finally:
        await store.close()
