"""The PostgreSQL backend's statements (``engine.store.postgres``): written with named
parameters, numbered once into asyncpg's ``$n``. The verbs themselves run in the
conformance suite (test_base.py) on a real server."""

from __future__ import annotations

import itertools
import re

import pytest
import sqlalchemy as sa

from engine import events as ev
from engine.store import open_store
from engine.store.postgres import (
    EVENT_FIELDS,
    SCALAR_EVENTS,
    Statement,
    append_sql,
    create_sql,
    event_values,
)
from engine.types import ThreadKey
from tests.support.logs import user


def test_named_parameters_are_numbered_once_in_the_order_they_first_appear() -> None:
    statement = Statement(
        "SELECT :ids::text[], 'a:b', x::int FROM t WHERE id = ANY(:ids) AND n > :n_min"
    )
    assert statement.text == (
        "SELECT $1::text[], 'a:b', x::int FROM t WHERE id = ANY($1) AND n > $2"
    )
    assert statement.names == ("ids", "n_min")
    assert statement.args({"n_min": 3, "ids": ["a"], "unused": 0}) == [["a"], 3]
    with pytest.raises(KeyError):
        statement.args({"ids": ["a"]})


def test_leading_parameters_are_numbered_first_and_passed_by_position() -> None:
    statement = Statement("SELECT :n, :a, :b, :a", leading=("a", "b"))
    assert statement.text == "SELECT $3, $1, $2, $1"
    assert statement.names == ("a", "b", "n") and statement.named == ("n",)
    assert statement.args({"n": 3}, ["x", "y"]) == ["x", "y", 3]


def test_every_append_takes_its_values_by_name_after_its_events() -> None:
    """The batch's variants differ in their parts and in how many events they bind,
    never in what a value is called; the events come first, by position."""
    common = {"thread_id", "last_seq", "status", "wake_at", "requester", "alert_key", "now"}
    for keys, snapshot, events in itertools.product(
        (False, True), (False, True), range(SCALAR_EVENTS + 1)
    ):
        statement = append_sql(keys, snapshot, events)
        wanted = common | {"expected_seq", "origin", "wakes"}
        wanted |= {"keys"} if keys else set()
        wanted |= {"snapshot"} if snapshot else set()
        assert set(statement.named) == wanted, (keys, snapshot, events)
        leading = len(EVENT_FIELDS) * (events or 1)
        assert len(statement.names) == leading + len(wanted)
        numbers = {int(n) for n in re.findall(r"\$(\d+)", statement.text)}
        assert numbers == set(range(1, len(statement.names) + 1))
        assert append_sql(keys, snapshot, events) is statement  # built once
    for events in range(SCALAR_EVENTS + 1):
        statement = create_sql(events)
        assert set(statement.named) == common | {"team", "channel", "root_ts", "snapshot"}
        assert len(statement.names) == len(EVENT_FIELDS) * (events or 1) + len(statement.named)


def test_small_batches_bind_scalars_and_larger_ones_arrays() -> None:
    row = {column: column for column in EVENT_FIELDS}
    assert event_values([row]) == (1, list(EVENT_FIELDS))
    assert event_values([row] * SCALAR_EVENTS)[0] == SCALAR_EVENTS
    assert event_values([row] * (SCALAR_EVENTS + 1)) == (
        0,
        [[column] * (SCALAR_EVENTS + 1) for column in EVENT_FIELDS],
    )
    assert event_values([]) == (0, [[] for _ in EVENT_FIELDS])


def batch(n: int, key: str) -> list[ev.Event]:
    """An input with dedupe key ``key`` and ``n - 1`` events without one."""
    posted = [ev.MessagePosted(shows_event_id="e", channel="C1", ts=f"2.{i}") for i in range(n - 1)]
    return [user("hi", dedupe_key=key), *posted]


@pytest.mark.postgres
@pytest.mark.parametrize("n", [1, SCALAR_EVENTS, SCALAR_EVENTS + 1])
async def test_a_batch_round_trips_whichever_form_binds_it(pg_url: str, n: int) -> None:
    """Scalars up to SCALAR_EVENTS events, arrays above: the same rows either way,
    NULL dedupe keys included, and the same duplicates."""
    store = await open_store(pg_url)
    try:
        # A new thread with its first events (create_sql).
        first, created = await store.append_input(
            ThreadKey("T1", "C1", "1.0"), lambda _: batch(n, "Ev01"), fresh=True
        )
        assert await store.select_events(first) == created.events
        # An append with a dedupe key (keys), then one without (no keys).
        tid = await store.create_thread(ThreadKey("T1", "C1", "2.0"))
        keyed = await store.append(tid, 0, batch(n, "Ev02"))
        assert keyed.state is not None
        more = [ev.MessagePosted(shows_event_id="f", channel="C1", ts=f"3.{i}") for i in range(n)]
        plain = await store.append(tid, n, more, state=keyed.state)
        assert await store.select_events(tid) == keyed.events + plain.events
        assert [e.seq for e in keyed.events + plain.events] == list(range(1, 2 * n + 1))
        # The stored input, found by the append's own statement.
        state = await store.load(tid)
        again = await store.append(tid, 2 * n, batch(n, "Ev02"), state=state)
        assert again.deduplicated and again.events == keyed.events[:1]
        assert (await store.get_thread(tid)).last_seq == 2 * n
        read = sa.text("SELECT thread_id, dedupe_key FROM events ORDER BY thread_id, seq")
        async with store.engine.begin() as conn:
            stored = (await conn.execute(read)).all()
    finally:
        await store.close()
    assert [key for thread, key in stored if thread == first] == ["Ev01", *[None] * (n - 1)]
    assert [key for thread, key in stored if thread == tid] == ["Ev02", *[None] * (2 * n - 1)]
