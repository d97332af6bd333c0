"""The PostgreSQL backend's statements (``engine.store.postgres``): written with named
parameters, numbered once into asyncpg's ``$n``. The verbs themselves run in the
conformance suite (test_base.py) on a real server."""

from __future__ import annotations

import re

import pytest

from engine.store.postgres import APPEND_SQL, CREATE_SQL, Statement


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


def test_every_append_takes_its_values_by_name() -> None:
    """The batch's variants differ in their parts, never in what a value is called."""
    common = {"seqs", "event_ids", "types", "actors", "payloads", "dedupe_keys", "versions"}
    common |= {"thread_id", "last_seq", "status", "wake_at", "requester", "alert_key", "now"}
    for (keys, snapshot), statement in APPEND_SQL.items():
        wanted = common | {"expected_seq", "origin", "wakes"}
        wanted |= {"keys"} if keys else set()
        wanted |= {"snapshot"} if snapshot else set()
        assert set(statement.names) == wanted, (keys, snapshot)
        numbers = {int(n) for n in re.findall(r"\$(\d+)", statement.text)}
        assert numbers == set(range(1, len(wanted) + 1))
    assert set(CREATE_SQL.names) == common | {"team", "channel", "root_ts", "snapshot"}
