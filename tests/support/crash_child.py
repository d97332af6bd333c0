"""A child process for crash tests: drives one scripted thread to its end.

Run as ``python tests/support/crash_child.py`` with DATABASE_URL, EFFECTS_DIR and
optionally OPSLOOP_FAULTS (engine/faults.py) to SIGKILL itself at a boundary. Every
input it sends carries a dedupe key, so a re-run continues instead of starting over.

Side effects are counted outside the process: ``invocations.log`` gets a line per tool
invocation, ``effects.log`` a line per effect actually made (the tools are idempotent by
their idempotency key, as a real target system would be).

CRASH_SCENARIO=mcp drives one call of a real stdio MCP server's tool instead
(tests/support/mcp_counter_server.py, which counts its effect in ``mcp_counter``);
MCP_HOLD_S is how long the server holds the call open after its effect.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
from pathlib import Path

from pydantic import BaseModel

from engine import faults
from engine.inputs import Decider, decide_approval, decide_reconcile, post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.reviewers import ReviewerRule
from engine.rules import PolicySet
from engine.runner import Runner, RunnerConfig
from engine.store import Store, ThreadKey, open_store
from tools import ToolContext, ToolRegistry, tool
from tools.mcp import McpServerConfig, McpSource

EFFECTS = Path(os.environ.get("EFFECTS_DIR", "."))
KEY = ThreadKey("T_CRASH", "C_CRASH", "1700000000.000100")
REGISTRY = ToolRegistry()


class LookupArgs(BaseModel):
    q: str


class DeployArgs(BaseModel):
    service: str


def _append_line(name: str, line: str) -> None:
    with open(EFFECTS / name, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _effect_once(kind: str, ctx: ToolContext) -> None:
    """The target system: makes the effect unless this idempotency key was seen."""
    _append_line("invocations.log", f"{kind} {ctx.idempotency_key} {ctx.attempt}")
    path = EFFECTS / "effects.log"
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        if any(line.split()[1] == ctx.idempotency_key for line in f if line.strip()):
            return
        f.write(f"{kind} {ctx.idempotency_key}\n")
        f.flush()
        os.fsync(f.fileno())
    faults.hit("tool_effect")  # die between the effect and its tool_result


@tool(registry=REGISTRY)
async def lookup(args: LookupArgs, ctx: ToolContext) -> dict:
    """Look up the status of a service."""
    _effect_once("lookup", ctx)
    return {"status": "green", "q": args.q}


@tool(policy="approve_before_run", registry=REGISTRY)
async def deploy(args: DeployArgs, ctx: ToolContext) -> dict:
    """Deploy a service."""
    _effect_once("deploy", ctx)
    return {"deployed": args.service, "version": 42}


@tool(registry=REGISTRY, idempotent=False)
async def restart(args: DeployArgs, ctx: ToolContext) -> dict:
    """Restart a service (not idempotent: the target keeps no key)."""
    _append_line("restarts.log", f"restart {ctx.idempotency_key} {ctx.attempt}")
    faults.hit("tool_effect")  # die between the effect and its tool_result
    return {"restarted": args.service}


SCRIPT = [call("lookup", q="api"), call("deploy", service="api"), say("api is deployed")]
# CRASH_SCENARIO=unknown: one non-idempotent call; RECONCILE (happened, retry, abandon)
# is what a person says when its outcome is unknown (unset: leave it waiting).
UNKNOWN_SCRIPT = [call("restart", service="api"), say("api was restarted")]
# CRASH_SCENARIO=mcp: the same, the call going to a real MCP server (its tools default
# to approve_before_run and non-idempotent).
MCP_SCRIPT = [call("mcp__counter__restart", service="api"), say("api was restarted")]
MCP_SERVER = Path(__file__).resolve().with_name("mcp_counter_server.py")


def mcp_source() -> McpSource:
    hold = os.environ.get("MCP_HOLD_S", "0")
    args = [str(MCP_SERVER), str(EFFECTS), "--hold", hold]
    return McpSource("counter", McpServerConfig(command=sys.executable, args=args))


async def drive(store: Store, runner: Runner, deadline: float) -> str:
    posted = await post_user_message(
        store, KEY, text="deploy api please", user="U_ALICE", dedupe_key="Ev-1"
    )
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        state = await runner.run(posted.thread_id)
        if state is None:  # a dead process still holds the lease until it expires
            await asyncio.sleep(0.1)
            continue
        if state.status == "awaiting_approval" and state.pending is not None:
            await decide_approval(
                store,
                posted.thread_id,
                tool_call_id=state.pending.tool_call_id,
                decider=Decider("U_BOB"),
                decision="approve",
                reviewers=ReviewerRule(),
                dedupe_key="click-1",
            )
            continue
        if state.status == "awaiting_reconcile" and state.pending is not None:
            decision = os.environ.get("RECONCILE")
            if not decision:
                return state.status
            await decide_reconcile(
                store,
                posted.thread_id,
                tool_call_id=state.pending.tool_call_id,
                decider=Decider("U_BOB"),
                decision=decision,  # type: ignore[arg-type]
                reviewers=ReviewerRule(),
                dedupe_key="reconcile-1",
            )
            continue
        if state.status in ("idle", "failed", "cancelled"):
            return state.status
        await asyncio.sleep(0.05)
    return "timeout"


async def main() -> int:
    scenario = os.environ.get("CRASH_SCENARIO")
    if scenario == "mcp":
        return await main_mcp()
    script = UNKNOWN_SCRIPT if scenario == "unknown" else SCRIPT
    return await run_script(script, REGISTRY)


async def main_mcp() -> int:
    source = mcp_source()
    registry = ToolRegistry()
    try:
        for mcp_tool in await source.open():
            registry.register(mcp_tool)
        return await run_script(MCP_SCRIPT, registry, policy=PolicySet())
    finally:
        await source.close()


async def run_script(
    script: list, registry: ToolRegistry, *, policy: PolicySet | None = None
) -> int:
    store = await open_store(os.environ["DATABASE_URL"])
    lease = float(os.environ.get("LEASE_SECONDS", "1.0"))
    config = RunnerConfig(lease_ttl_s=lease)
    runner = Runner(store, ScriptedModel(script), registry, config, policy=policy)
    try:
        status = await drive(store, runner, asyncio.get_running_loop().time() + 60)
    finally:
        await store.close()
    print(status)
    return 0 if status in ("idle", "awaiting_reconcile") else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
