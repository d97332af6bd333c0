"""Tools of every policy for engine tests; ``effects`` counts what each really did.

The golden logs (tests/golden) replay with these tools: their names, descriptions and
argument models are part of those logs, so change them only with a new golden.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from pydantic import BaseModel

from tools import RetryableToolError, ToolContext, ToolRegistry, WaitFor, tool
from tools.errors import OutcomeUnknown


class Args(BaseModel):
    name: str


def make_tools(effects: Counter) -> ToolRegistry:
    reg = ToolRegistry()

    @tool(registry=reg)
    async def lookup(args: Args, ctx: ToolContext) -> dict:
        """Look something up."""
        effects["lookup"] += 1
        return {"found": args.name}

    @tool(policy="approve_before_run", registry=reg)
    async def deploy(args: Args, ctx: ToolContext) -> dict:
        """Deploy a service."""
        effects["deploy"] += 1
        return {"deployed": args.name}

    @tool(registry=reg)
    async def flaky(args: Args, ctx: ToolContext) -> dict:
        """Fails twice, then works."""
        effects[f"flaky:{ctx.attempt}"] += 1
        if ctx.attempt < 3:
            raise RetryableToolError("upstream 503")
        return {"ok": ctx.attempt}

    @tool(registry=reg)
    async def broken(args: Args, ctx: ToolContext) -> dict:
        """Always raises."""
        raise ValueError("disk on fire")

    @tool(policy="wait_for_external_event", registry=reg)
    async def train(args: Args, ctx: ToolContext) -> WaitFor:
        """Start a training job and wait for it."""
        effects["train"] += 1
        return WaitFor(
            f"training {args.name}", data={"job": args.name}, timeout_s=60, poll_every_s=5
        )

    @train.poller
    async def check(data: dict, ctx: ToolContext) -> dict | None:
        effects["poll"] += 1
        return {"job": data["job"], "accuracy": 0.9} if effects["poll"] >= 2 else None

    return reg


def make_ruled_tools(effects: Counter) -> ToolRegistry:
    """``make_tools`` plus what policy rules act on: a non-idempotent ``restart`` (name
    "lost" raises ``OutcomeUnknown`` after counting its effect, "slow" outlives any
    tool timeout), a ``purge`` rules reject,
    and ``gated_train``, a waiting tool a rule puts behind an approval."""
    reg = make_tools(effects)

    @tool(policy="approve_before_run", idempotent=False, registry=reg)
    async def restart(args: Args, ctx: ToolContext) -> dict:
        """Restart a service."""
        effects["restart"] += 1
        if args.name == "lost":
            raise OutcomeUnknown("the connection dropped after the request was sent")
        if args.name == "slow":
            await asyncio.sleep(60)  # outlives the runner's tool timeout
        return {"restarted": args.name, "attempt": ctx.attempt}

    @tool(registry=reg)
    async def purge(args: Args, ctx: ToolContext) -> dict:
        """Delete everything about something."""
        effects["purge"] += 1
        return {"purged": args.name}

    @tool(policy="wait_for_external_event", registry=reg)
    async def gated_train(args: Args, ctx: ToolContext) -> WaitFor:
        """Start a training job (after approval) and wait for it."""
        effects["gated_train"] += 1
        return WaitFor(f"training {args.name}", data={"job": args.name}, timeout_s=60)

    return reg
