"""Instructions per engine step, counted by callgrind (``engine_overhead.py --instructions``).

The parent (the bench, not under valgrind) starts this file as a child process under
``valgrind --tool=callgrind``. The child warms up with collection off, then runs two
regions, each inside ``operator.call``: a C function nothing in the loop calls, so
callgrind switches collection on when it is entered and off when it returns, and dumps
each region to a file of its own (``--toggle-collect``, ``--dump-after``). The regions are
K threads of no tool step (a message, then a final answer) and K threads of ``STEPS`` tool
steps. Their difference over K x ``STEPS`` is the marginal cost of a step: the span the
step time measures, without a thread's own start and end (post, lease, load, final
answer, release). PostgreSQL runs in processes of its own: only ours is counted.

A second, native run of the same two regions under cProfile gives the Python-level
picture: calls per step are exact, times per step are only a guide (the profiler's own
cost weighs on small functions; the machine's neighbours move the rest).
"""

from __future__ import annotations

import asyncio
import cProfile
import operator
import os
import pstats
import re
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

# Collection toggles on entering and leaving this C function (Modules/_operator.c).
TOGGLE = "_operator_call"
CHILD = Path(__file__).resolve()
# The interpreter's call dispatch (frames, calls, coroutine sends, tasks): each holds
# nearly all of what it calls and says nothing about where the work is.
_DISPATCH = re.compile(
    r"_?PyEval|_PyEvalFrame|_?PyObject_(Vectorcall|Call|FastCall|MakeTpCall)|PyVectorcall"
    r"|_?PyFunction_Vectorcall|method_vectorcall|cfunction_|PyIter_Send|PyGen_am_send|gen_"
    r"|task_|context_run|__Pyx_Coroutine|__Pyx_CoroutineAwait|slot_tp_call|wrapperdescr_call"
    r"|initialize_locals|_PyFrame_Clear|_operator_call|PyCFunction_Call|_Py_Dealloc"
)
# Cython's C names: a prefix, then each dotted part as its length and its text.
_CYTHON = re.compile(r"^__pyx_[a-z]+_")
_PART = re.compile(r"_?(\d+)")
# Entries holding more than this share of a step are the program's frame (main, the
# event loop), not a place the work goes.
_FRAME_SHARE = 0.5


@dataclass(frozen=True)
class Row:
    """One function's instructions per step: inclusive (with what it calls) and self."""

    name: str
    inclusive: float
    self_: float


@dataclass
class Dump:
    """One callgrind dump: the total, and per (object, function) its self cost and the
    cost of the calls it made. Callgrind names a function once per recursion depth
    (``f'2``); the cost of depth 1 and its calls holds the deeper ones."""

    total: int = 0
    own: dict[tuple[str, str], int] = field(default_factory=dict)
    calls: dict[tuple[str, str], int] = field(default_factory=dict)

    def inclusive(self, key: tuple[str, str]) -> int:
        return self.own.get(key, 0) + self.calls.get(key, 0)


# --- the child, under valgrind ---------------------------------------------------------


def child(url: str, threads: int) -> None:
    """Warm up (collection off), then the two regions, each its own callgrind dump."""
    # The bench's own helpers, so the loop measured is the one the step time measures.
    from engine_overhead import STEPS, make_tools, run_thread, runner_config, script

    from engine.models.scripted import ScriptedModel
    from engine.runner import Runner
    from engine.store import open_store

    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(open_store(url))
    tools = make_tools()
    runners = {
        n: Runner(store, ScriptedModel(script(n)), tools, runner_config()) for n in (0, STEPS)
    }

    async def region(steps: int, count: int) -> None:
        for _ in range(count):
            await run_thread(store, runners[steps], steps)

    try:
        for steps in (0, STEPS):
            loop.run_until_complete(region(steps, 2))
        for steps in (0, STEPS):
            operator.call(loop.run_until_complete, region(steps, threads))
    finally:
        loop.run_until_complete(store.close())
        loop.close()


# --- the parent ------------------------------------------------------------------------


def valgrind_missing() -> str | None:
    """Why ``--instructions`` cannot run here, or None."""
    if shutil.which("valgrind") is None:
        return "--instructions needs valgrind (callgrind), e.g. apt-get install valgrind"
    return None


@dataclass(frozen=True)
class Counted:
    """Instructions per step: in all, by function (inclusive, dispatch left out) and by
    the object file that executed them (self)."""

    per_step: float
    functions: list[Row]
    objects: list[tuple[str, float]]


async def count_instructions(url: str, threads: int, steps: int) -> Counted:
    """Run the child under callgrind and subtract its two regions (see the module
    docstring): instructions per step, deterministic up to the event loop's polling."""
    with tempfile.TemporaryDirectory(prefix="opsloop_callgrind_") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "-q",
            "--collect-atstart=no",
            f"--toggle-collect={TOGGLE}",
            f"--dump-after={TOGGLE}",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(CHILD),
            url,
            str(threads),
        ]
        # A fixed hash seed: the same dict and set layouts, run after run.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        proc = await asyncio.create_subprocess_exec(*cmd, env=env)
        if await proc.wait() != 0:
            raise RuntimeError(f"the callgrind child failed with exit code {proc.returncode}")
        parts = [Path(f"{out}.1"), Path(f"{out}.2")]
        if not all(p.exists() for p in parts):
            raise RuntimeError(f"callgrind made no dump after {TOGGLE}: is this Python stripped?")
        base, full = [await asyncio.to_thread(parse_dump, p) for p in parts]
    per = threads * steps
    total = (full.total - base.total) / per
    rows = []
    for key in full.own.keys() | full.calls.keys():
        obj, fn = key
        if "'" in fn or _DISPATCH.match(fn):
            continue
        inclusive = (full.inclusive(key) - base.inclusive(key)) / per
        if inclusive < total * _FRAME_SHARE:
            own = (full.own.get(key, 0) - base.own.get(key, 0)) / per
            rows.append(Row(f"{readable(fn, obj)} [{obj.split('.cpython')[0]}]", inclusive, own))
    rows.sort(key=lambda r: r.inclusive, reverse=True)
    by_object: dict[str, float] = {}
    for dump, sign in ((full, 1), (base, -1)):
        for (obj, _), cost in dump.own.items():
            by_object[obj] = by_object.get(obj, 0.0) + sign * cost / per
    objects = sorted(by_object.items(), key=lambda kv: kv[1], reverse=True)
    return Counted(total, rows, objects)


def readable(fn: str, obj: str) -> str:
    """Cython names as dotted Python names; an address in a library without symbols
    (pydantic_core) as ``library+address``."""
    if fn.startswith("0x"):
        return f"{obj.split('.')[0]}+0x{int(fn, 16):x}"
    head = _CYTHON.match(fn)
    if not head:
        return fn
    rest, parts = fn[head.end() :], []
    while rest and (m := _PART.match(rest)):
        size, rest = int(m.group(1)), rest[m.end() :]
        parts.append(rest[:size])
        rest = rest[size:]
    if rest.startswith("_"):  # the function's own name carries no length
        parts.append(rest[1:])
        rest = ""
    return ".".join(parts) if parts and not rest else fn


def parse_dump(path: Path) -> Dump:
    """Self and call costs per (object, function) of a callgrind dump (its format:
    https://valgrind.org/docs/manual/cl-format.html). A cost line right after
    ``calls=`` is the inclusive cost of that call; any other cost line is self cost."""
    dump = Dump()
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    obj = fn = ""
    after_call = False
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            head, eq, rest = line.rstrip("\n").partition("=")
            if eq and head in ("ob", "fn"):
                name = _name(names[head], rest)
                if head == "ob":
                    obj = Path(name).name
                else:
                    fn = name
                continue
            if eq and head in ("cob", "cfn"):  # compressed names defined here count too
                _name(names[head[1:]], rest)
                continue
            if eq and head == "calls":
                after_call = True
                continue
            if line.startswith("totals:"):
                dump.total = int(line.split()[1])
                continue
            if not line[:1] or line[0] not in "0123456789+-*":
                continue
            cost = int(line.split()[-1])
            target = dump.calls if after_call else dump.own
            target[(obj, fn)] = target.get((obj, fn), 0) + cost
            after_call = False
    return dump


def _name(table: dict[str, str], spec: str) -> str:
    """``(id) name`` defines a compressed name, ``(id)`` refers to it."""
    if spec.startswith("("):
        ref, _, name = spec.partition(")")
        if name.strip():
            table[ref] = name.strip()
        return table.get(ref, ref)
    return spec.strip()


# cProfile rows that are the event loop and the bench, not the engine.
_LOOP = (
    "asyncio/",
    "selectors.py",
    "bench/",
    "_contextvars.Context",
    "of 'coroutine'",
    "select.epoll",
)


@dataclass(frozen=True)
class Profiled:
    """A Python function per step, by cProfile: calls (exact) and µs (a guide)."""

    name: str
    calls: float
    self_us: float
    cum_us: float


async def profile_steps(
    one_thread: Callable[[int], Awaitable[None]], threads: int, steps: int
) -> list[Profiled]:
    """cProfile of ``threads`` threads of 0 and of ``steps`` tool steps, run natively:
    per step, their difference over threads x steps."""
    stats: dict[int, dict[str, tuple[int, float, float]]] = {}
    for n in (0, steps):
        await one_thread(n)  # warm
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(threads):
            await one_thread(n)
        profiler.disable()
        raw = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        stats[n] = {
            _where(f, line, fn): (nc, tt, ct)
            for (f, line, fn), (_cc, nc, tt, ct, _callers) in raw.items()
        }
    per = threads * steps
    rows = []
    for name, (nc, tt, ct) in stats[steps].items():
        bnc, btt, bct = stats[0].get(name, (0, 0.0, 0.0))
        if not any(part in name for part in _LOOP):
            rows.append(
                Profiled(name, (nc - bnc) / per, (tt - btt) / per * 1e6, (ct - bct) / per * 1e6)
            )
    return rows


def _where(file: str, line: int, fn: str) -> str:
    if file == "~":  # a built-in: its name says it all
        return fn
    return f"{'/'.join(Path(file).parts[-2:])}:{line}({fn})"


def report(counted: Counted, profiled: list[Profiled], top: int) -> str:
    """The stderr tables of ``--instructions``."""
    total = counted.per_step
    lines = [
        f"instructions per step (callgrind; marginal: 20-step threads less 0-step threads): "
        f"{total:,.0f}",
        f"top {top} C functions by inclusive instructions per step (interpreter dispatch "
        f"left out; pydantic_core has no symbols, so only addresses):",
        f"{'inclusive':>11} {'%':>6} {'self':>9}  function [object]",
    ]
    lines += [
        f"{r.inclusive:>11,.0f} {r.inclusive / total:>6.1%} {r.self_:>9,.0f}  {r.name}"
        for r in counted.functions[:top]
    ]
    lines.append("instructions per step by the object that executed them (self):")
    lines += [f"{cost:>11,.0f} {cost / total:>6.1%}  {obj}" for obj, cost in counted.objects[:8]]
    for key, label in (("cum_us", "cumulative"), ("self_us", "self")):
        lines += [
            f"top {top} Python functions by {label} time per step (cProfile of the same loop, "
            f"run natively: calls are exact, microseconds only a guide):",
            f"{'calls':>7} {'self_us':>8} {'cum_us':>8}  function",
        ]
        ordered = sorted(profiled, key=lambda r: getattr(r, key), reverse=True)
        lines += [
            f"{r.calls:>7.1f} {r.self_us:>8.1f} {r.cum_us:>8.1f}  {r.name}" for r in ordered[:top]
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]))
