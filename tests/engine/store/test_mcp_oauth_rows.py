"""The store's MCP OAuth verbs (``mcp_oauth``, revision 0007), on SQLite and PostgreSQL:
what tools/mcp/auth.py keeps of a server's OAuth, shared by every replica."""

from __future__ import annotations

import asyncio

from engine.store import Store
from tests.engine.store.test_base import more_stores
from tests.support.logs import at

NOW = at(0)


async def test_a_server_without_oauth_has_no_row(store: Store) -> None:
    assert await store.select_mcp_oauth("grafana") is None


async def test_tokens_client_and_authorization_are_kept_side_by_side(store: Store) -> None:
    await store.upsert_mcp_client("grafana", "b1", '{"client_id": "c"}', NOW)
    await store.upsert_mcp_tokens("grafana", "b1", '{"access_token": "t"}', at(3600), at(1))
    await store.upsert_mcp_pending("grafana", "b1", "st", "ver", "https://as/authorize?x", at(2))
    row = await store.select_mcp_oauth("grafana")
    assert row is not None
    assert (row.binding, row.tokens, row.expires_at) == ("b1", '{"access_token": "t"}', at(3600))
    assert row.client_info == '{"client_id": "c"}'
    assert (row.pending_state, row.pending_verifier, row.pending_url) == (
        "st",
        "ver",
        "https://as/authorize?x",
    )
    assert (row.pending_since, row.updated_at, row.code) == (at(2), at(2), None)
    await store.upsert_mcp_tokens("grafana", "b1", '{"access_token": "u"}', None, at(4))
    row = await store.select_mcp_oauth("grafana")
    assert row is not None and row.tokens == '{"access_token": "u"}' and row.expires_at is None
    assert row.pending_state == "st"  # the other columns stay


async def test_a_callback_code_is_kept_for_the_waiting_state_and_taken_once(store: Store) -> None:
    await store.upsert_mcp_pending("grafana", "b1", "st", "ver", "https://as/a", NOW)
    assert await store.answer_mcp_pending("other", "code", None, NOW) is None  # unknown state
    assert await store.take_mcp_code("grafana", "st", NOW) is None  # nothing brought yet
    assert await store.answer_mcp_pending("st", "code1", "https://as", at(1)) == "grafana"
    assert await store.answer_mcp_pending("st", "code2", None, at(1)) is None  # answered
    assert await store.take_mcp_code("grafana", "wrong", at(2)) is None
    assert await store.take_mcp_code("grafana", "st", at(2)) == ("code1", "https://as", "ver")
    assert await store.take_mcp_code("grafana", "st", at(3)) is None  # once
    row = await store.select_mcp_oauth("grafana")
    assert row is not None and (row.pending_state, row.pending_url, row.code) == (None,) * 3


async def test_a_new_authorization_voids_the_one_before_and_its_code(store: Store) -> None:
    await store.upsert_mcp_pending("grafana", "b1", "st1", "v1", "https://as/1", NOW)
    assert await store.answer_mcp_pending("st1", "code", None, NOW) == "grafana"
    await store.upsert_mcp_pending("grafana", "b1", "st2", "v2", "https://as/2", at(1))
    assert await store.take_mcp_code("grafana", "st1", at(2)) is None
    assert await store.answer_mcp_pending("st1", "late", None, at(2)) is None
    row = await store.select_mcp_oauth("grafana")
    assert row is not None and (row.pending_state, row.code) == ("st2", None)


async def test_replicas_racing_for_a_code_get_it_once(store: Store, db_url: str) -> None:
    await store.upsert_mcp_pending("grafana", "b1", "st", "ver", "https://as/a", NOW)
    await store.answer_mcp_pending("st", "code", None, NOW)
    async with more_stores(db_url, 4) as stores:
        taken = await asyncio.gather(*(s.take_mcp_code("grafana", "st", NOW) for s in stores))
    assert taken.count(None) == 3 and ("code", None, "ver") in taken


async def test_delete_forgets_a_server(store: Store) -> None:
    await store.upsert_mcp_tokens("grafana", "b1", "{}", None, NOW)
    await store.upsert_mcp_tokens("kube", "b2", "{}", None, NOW)
    await store.delete_mcp_oauth("grafana")
    assert await store.select_mcp_oauth("grafana") is None
    assert await store.select_mcp_oauth("kube") is not None
