"""Golden logs: threads written by an earlier release (tests/golden/*.jsonl) must still
parse (upcast through the mapper), reduce to the status they ended in, store and read
back on both backends, and replay every model decision to its recorded prompt hash.

The files are data: a change that breaks reading them fails here; regenerate them
(tests/golden/make_golden.py) only when a new event type needs a thread.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from engine import events as ev
from engine import mapper
from engine.replay import decisions, replay_all
from engine.state import reduce
from engine.store import Store, ThreadKey
from tests.support import demo_tools

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
FILES = sorted(GOLDEN.glob("*.jsonl"))


@dataclass(frozen=True)
class Golden:
    """One golden file: its header line and its stored rows."""

    path: Path

    @cached_property
    def lines(self) -> list[dict[str, Any]]:
        text = self.path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    @property
    def header(self) -> dict[str, Any]:
        return self.lines[0]

    @property
    def rows(self) -> list[dict[str, Any]]:
        # As the store's select hands them to the mapper; the file keeps created_at as text.
        return [
            {**r, "created_at": datetime.fromisoformat(r["created_at"])} for r in self.lines[1:]
        ]

    @cached_property
    def events(self) -> list[ev.AnyEvent]:
        return [mapper.from_row(row) for row in self.rows]

    def tools(self) -> list[Any]:
        assert self.header["tools_from"] == demo_tools.__name__
        return [
            t for name in self.header["tools"] for t in getattr(demo_tools, name)(Counter()).all()
        ]


GOLDENS = [pytest.param(Golden(path), id=path.stem) for path in FILES]


@pytest.mark.parametrize("golden", GOLDENS)
def test_every_stored_row_parses_through_the_mapper(golden: Golden) -> None:
    assert golden.header["golden"] == 1
    rows, events = golden.rows, golden.events
    assert len(events) == golden.header["events"] > 0
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert {e.thread_id for e in events} == {rows[0]["thread_id"]}
    assert [(e.type, e.event_id) for e in events] == [(r["type"], r["event_id"]) for r in rows]
    assert len({e.event_id for e in events}) == len(events)


@pytest.mark.parametrize("golden", GOLDENS)
def test_the_log_reduces_to_the_status_it_ended_in(golden: Golden) -> None:
    state = reduce(golden.events)
    assert (state.status, state.last_seq) == (golden.header["status"], len(golden.events))


@pytest.mark.parametrize("golden", GOLDENS)
async def test_the_log_stores_and_reads_back_the_same(golden: Golden, store: Store) -> None:
    key = ThreadKey(**golden.header["key"])
    thread_id = await store.create_thread(key)
    state = await store.load(thread_id)
    for e in golden.events:
        # The store's own write path, event by event, so each keeps its time.
        done = await store.append(thread_id, e.seq - 1, [e], state=state, now=e.created_at)
        assert done.state is not None and not done.deduplicated
        state = done.state
    expected = [e.model_copy(update={"thread_id": thread_id}) for e in golden.events]
    assert await store.select_events(thread_id) == expected
    assert (await store.load(thread_id)).status == golden.header["status"]
    info = await store.get_thread(thread_id)
    assert (info.status, info.last_seq) == (golden.header["status"], len(expected))


@pytest.mark.parametrize("golden", GOLDENS)
def test_every_model_decision_replays_to_its_prompt_hash(golden: Golden) -> None:
    replayed = replay_all(golden.events, golden.tools())
    assert len(replayed) == len(decisions(golden.events)) > 0
    mismatches = [r.verdict() for r in replayed if not r.matches]
    assert not mismatches, "\n".join(mismatches)


def test_the_goldens_hold_every_event_type() -> None:
    seen = {row["type"] for path in FILES for row in Golden(path).lines[1:]}
    missing = [t for t in ev.EVENT_TYPES if t not in seen]
    assert not missing, (
        f"no golden log holds {', '.join(missing)}: give it a thread in "
        "tests/golden/make_golden.py and run that script"
    )
    assert seen <= set(ev.EVENT_TYPES)
