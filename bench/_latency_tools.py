"""The tools ``bench/latency.py`` loads into ``opsloop serve`` (``OPSLOOP_TOOLS``).

``bench_deploy`` needs an approval; when it runs it appends ``{"tag", "t"}`` (wall-clock
seconds) to the file named by ``BENCH_LATENCY_EFFECTS``, so the bench can time
click → tool started from the side effect itself. ``bench_wait`` starts an external job
that only a ``POST /hooks/{wait_id}`` finishes. Bench-only: the file path comes from
the environment because this module is not part of opsloop.
"""

from __future__ import annotations

import json
import os
import time

from pydantic import BaseModel

from tools import ToolContext, WaitFor, tool


class TagArgs(BaseModel):
    tag: str


@tool(policy="approve_before_run")
async def bench_deploy(args: TagArgs, ctx: ToolContext) -> dict:
    """Deploy the bench's service (needs an approval)."""
    stamp = time.time()  # first thing: the moment the side effect starts
    path = os.environ.get("BENCH_LATENCY_EFFECTS")
    if path:
        # One short line per call in append mode: writes from two replicas never interleave.
        with open(path, "a", encoding="utf-8") as f:  # noqa: ASYNC230 - a few bytes, local
            f.write(json.dumps({"tag": args.tag, "t": stamp, "attempt": ctx.attempt}) + "\n")
    return {"deployed": args.tag}


@tool(policy="wait_for_external_event")
async def bench_wait(args: TagArgs, ctx: ToolContext) -> WaitFor:
    """Start the bench's external job and wait for its webhook."""
    return WaitFor(f"bench job {args.tag}", data={"tag": args.tag}, timeout_s=600)
