"""How the prompt projection grows with a thread: time and size at 10 … 10,000 events.

Run: ``.venv/bin/python bench/context_growth.py [--quick]``. Threads are built by the
real runner (a scripted model, a run_now tool with ~1 KB results, a person asking
again every 20 steps) in a throwaway SQLite file, so compactions happen as they would
in production. Then, for each size, it measures what every model turn of that thread
pays: loading the state and the log after the latest compaction, and projecting it
(``engine.runner.project_thread``). One JSON line on stdout; progress on stderr.

Targets: the prompt stays within the budget at every size; projecting the 10,000-event
thread takes at most 5x the time of the 100-event one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from engine.context import Prompt
from engine.inputs import post_user_message
from engine.models.base import Decision
from engine.models.scripted import ScriptedModel, call, say
from engine.runner import Runner, RunnerConfig, project_thread
from engine.store import Store, ThreadKey, open_store
from tools import ToolContext, ToolRegistry, tool

SIZES = (10, 100, 1000, 10_000)
STEPS_PER_ROUND = 20
BUDGET_TOKENS = 8000


class Query(BaseModel):
    q: str


def make_tools() -> ToolRegistry:
    reg = ToolRegistry()

    @tool(registry=reg)
    async def fetch_metrics(args: Query, ctx: ToolContext) -> dict:
        """Fetch a page of metrics."""
        return {"q": args.q, "points": [{"t": i, "v": i * 7 % 13} for i in range(40)]}

    return reg


class RoundModel(ScriptedModel):
    """``steps`` tool calls, then an answer; again for every new message."""

    def __init__(self) -> None:
        super().__init__([])
        self.steps = STEPS_PER_ROUND
        self.left = 0

    def start_round(self, steps: int) -> None:
        self.steps = self.left = steps

    async def next_step(self, prompt: Prompt) -> Decision:
        if self.left == 0:
            return say(f"done after {self.steps} steps")
        self.left -= 1
        step = call("fetch_metrics", q=f"turn {prompt.turn}")
        assert callable(step)
        return step(prompt)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


async def grow(store: Store, runner: Runner, key: ThreadKey, events: int) -> str:
    """A thread of about ``events`` events: rounds of a message, k tool steps (4 events
    each: decision, request, start, result) and an answer."""
    model = runner.model
    assert isinstance(model, RoundModel)
    last_seq, n = 0, 0
    while True:
        k = min(STEPS_PER_ROUND, max(1, (events - last_seq - 3) // 4))
        model.start_round(k)
        posted = await post_user_message(store, key, text=f"check round {n}", user="U_OPS")
        state = await runner.run(posted.thread_id)
        assert state is not None and state.status == "idle", state
        last_seq, n = state.last_seq, n + 1
        if last_seq >= events - 3:
            return posted.thread_id


async def measure(store: Store, thread_id: str, tools: ToolRegistry, repeat: int) -> dict:
    times, prompt = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        prompt = await project_thread(store, thread_id, tools)
        times.append(time.perf_counter() - start)
    assert prompt is not None
    info = await store.get_thread(thread_id)
    return {
        "events": info.last_seq,
        "project_us": round(statistics.median(times) * 1e6, 1),
        "prompt_tokens": prompt.estimated_tokens,
        "messages": len(prompt.messages),
    }


async def main(quick: bool) -> dict:
    sizes = SIZES[:3] if quick else SIZES
    tools = make_tools()
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(f"sqlite:///{Path(tmp) / 'growth.db'}")
        try:
            cfg = RunnerConfig(context_budget_tokens=BUDGET_TOKENS, lease_ttl_s=600)
            runner = Runner(store, RoundModel(), tools, cfg)
            rows = []
            for size in sizes:
                start = time.perf_counter()
                tid = await grow(store, runner, ThreadKey("T", "C", f"{size}.0"), size)
                log(f"built a {size}-event thread in {time.perf_counter() - start:.1f} s")
                rows.append(await measure(store, tid, tools, repeat=30))
                log(f"{rows[-1]}")
        finally:
            await store.close()
    by_size = dict(zip(sizes, rows, strict=True))
    largest = by_size[sizes[-1]]
    ratio = largest["project_us"] / by_size[100]["project_us"]
    within = all(r["prompt_tokens"] <= BUDGET_TOKENS for r in rows)
    return {
        "bench": "context_growth",
        "budget_tokens": BUDGET_TOKENS,
        "sizes": rows,
        f"ratio_project_{sizes[-1]}_to_100": round(ratio, 2),
        "targets": {"prompt_tokens<=budget": True, f"ratio_project_{sizes[-1]}_to_100<=": 5.0},
        "pass": within and ratio <= 5.0,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="up to 1,000 events (smoke)")
    result = asyncio.run(main(parser.parse_args().quick))
    print(json.dumps(result))
