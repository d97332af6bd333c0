"""The tools of one MCP server as ``mcp__<server>__<tool>`` Tools (a ToolSource).

Every call re-reads the server's definition of its tool (a fresh ``tools/list``, no
reliance on change notifications) and refuses to run when it no longer hashes to the
definition the call was approved under (``ToolContext.definition_hash``): a server
that swaps a tool's description or schema after approval does not get the call.

A failure of that check, or of connecting, is ``McpUnavailable`` (retryable: nothing
ran); a failure once the ``tools/call`` went out is ``OutcomeUnknown`` (see connection.py).

What the model API would refuse is fixed or left out at load, never sent: a tool name
is mapped to its alphabet (``config.registered_name``; the server is called by its own
name), a top-level union in an input schema is flattened for the model while arguments
are still checked against the server's schema (``input_schema``). A tool that cannot be
offered (a schema that is not about objects, a name two of its tools map to) is left
out with one warning line, and ``left_out`` says which for ``doctor``. So is a tool
whose ``execution.taskSupport`` is "required": it answers only as an MCP task, which
opsloop does not run yet (every call of it would fail).

Definitions are live in a serving process (``connect`` then ``serve``, see keeper.py): a
server down at startup is served without, and its tools join when it comes up; a
changed definition (``notifications/tools/list_changed``, or a difference the pre-call
check sees) replaces its Tool in the registry, so the next decision is offered it, while
a call requested under the old one is still refused (the runner compares the hash it
recorded with the registry's, and this source with the server's). Tools the server adds
join; tools it removes leave.

A server may ask the requester a question in the middle of a call (elicitation): the
attempt then ends in a durable wait, and the attempt after it goes on with the answer
(tools/mcp/elicitation.py). Each call carries a progress token; the server's progress
reaches :data:`tools.mcp.progress.PROGRESS` (rate-limited there), never the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from typing import Any

import mcp_types as types
from mcp import Client

from tools.errors import OutcomeUnknown, ToolDefinitionError, ToolError
from tools.mcp import keeper
from tools.mcp.asking import (
    elicit_result,
    first_question,
    next_question,
    question,
    send_call,
    wait_for,
)
from tools.mcp.auth import AuthorizationNeeded, OAuthRecords, announcing
from tools.mcp.config import CONNECT_TIMEOUT_S, McpServerConfig, registered_name, server_name
from tools.mcp.connection import Asking, McpConnection, QuestionGone
from tools.mcp.elicitation import Question, answer_of, question_of
from tools.mcp.errors import (
    DefinitionChanged,
    McpLoadError,
    McpNotAuthorized,
    McpUnauthorized,
    McpUnavailable,
)
from tools.mcp.input_schema import COMBINATORS, Unfit, fit_for_the_model
from tools.mcp.progress import PROGRESS, ProgressHub
from tools.mcp.results import tool_output
from tools.registry import Tool, ToolRegistry
from tools.schema_tool import SchemaArguments, schema_tool

log = logging.getLogger(__name__)

_MAX_PAGES = 100  # a paginator that never ends cannot hang startup or a call
_NEEDS_TASKS = (
    'its execution.taskSupport is "required" (it runs only as an MCP task), '
    "and tools that require MCP tasks are not offered yet"
)


@dataclass(frozen=True)
class _Definition:
    """What the model is shown of one server tool, and its hash."""

    remote: str
    name: str
    description: str
    schema: dict[str, Any]  # as the model is shown it
    annotations: dict[str, Any]
    checks: dict[str, Any] | None = None  # the server's own, when the model is shown another
    unfit: str | None = None  # why the model API would refuse its schema: left out

    @property
    def hash(self) -> str:
        return definition_hash(self.name, self.description, self.schema)


class McpSource:
    """One MCP server's (allowlisted) tools; one session per process, reconnecting."""

    def __init__(
        self,
        name: str,
        server: McpServerConfig,
        *,
        call_timeout_s: float | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        oauth: OAuthRecords | None = None,
        progress: ProgressHub | None = None,
    ) -> None:
        """``name``: the server's key under ``tools.mcp``. ``call_timeout_s``: how long a
        call waits for its answer (None: no limit of its own); past it the outcome is
        unknown, so keep it below the engine's tool timeout. ``connect_timeout_s``: how
        long connecting may take. ``oauth``: where a server with ``auth:`` keeps its
        tokens (the store; :meth:`keep_oauth_in` sets it later)."""
        try:
            self.server_name = server_name(name)
        except ValueError as exc:
            raise McpLoadError(str(name), f"tools.mcp.{name}: {exc}") from None
        self.server = server
        self.call_timeout_s = call_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.name = f"mcp:{name}"
        self.key = f"tools.mcp.{name}"
        self._conn = McpConnection(name, server, connect_timeout_s=connect_timeout_s, oauth=oauth)
        # What is offered, by the server's tool name: its definition, and its Tool.
        self._loaded: dict[str, _Definition] = {}
        self._tools: dict[str, Tool] = {}
        self._first: dict[str, str] = {}  # registered name -> hash when first offered
        self._refreshing = asyncio.Lock()  # one listing applied at a time, in order
        self.left_out: list[str] = []  # one line per tool not offered, and why
        self.registry: ToolRegistry | None = None  # serving: where its tools are kept
        self._keeper: keeper.Keeper | None = None
        self.progress = progress or PROGRESS  # where notifications/progress go

    async def open(self) -> list[Tool]:
        """Connect, list every page, build the Tools; one-line McpLoadError otherwise."""
        try:
            async with asyncio.timeout(self.connect_timeout_s * 2):
                listed = await self._list()
            self._check_allowlist(listed)
            self._apply(listed)
        except BaseException as exc:
            await self._conn.close()
            error = self.load_error(exc)
            if error is exc:
                raise
            raise error from exc
        return list(self._tools.values())

    async def connect(self) -> None:
        """``serve``, first step: connect and list (bounded by the connect time); a server
        that cannot is noted, never raised (its tools join later). Sources connect at
        once; ``serve`` then takes their tools in the file's order."""
        self._keeper = keeper.Keeper(self, self._conn)
        await self._keeper.connect()

    def serve(self, registry: ToolRegistry) -> None:
        """``serve``, second step: offer the listed tools in ``registry`` (or say in one
        warning line that the server is down) and keep them as the server defines them,
        in the background, for as long as the source is open."""
        assert self._keeper is not None, "connect() first"
        self.registry = registry
        self._keeper.start()

    async def close(self) -> None:
        if self._keeper is not None:
            await self._keeper.stop()
        await self._conn.close()

    def keep_oauth_in(
        self, records: OAuthRecords, on_authorization_needed: AuthorizationNeeded | None = None
    ) -> None:
        """Where a server with ``auth:`` keeps its OAuth (the store), from the next
        connect on (tools/mcp/auth.py). ``on_authorization_needed(server, link, until,
        admins)``: told of each new link an admin must open, when the server names
        ``admins`` (serve posts it to them)."""
        self._conn.oauth = announcing(records, self.server, on_authorization_needed)

    async def refresh(self) -> None:
        """List the server's tools now and offer them as they are (bounded by the
        connect time): a changed definition replaces its Tool, new tools join, removed
        ones leave. ``ToolError`` (``McpUnavailable`` when it is down) or ``TimeoutError``."""
        async with self._refreshing:
            async with asyncio.timeout(self.connect_timeout_s * 2):
                listed = await self._list()
            self._apply(listed)

    @property
    def up(self) -> bool:
        """Did the last exchange with the server work?"""
        return self._conn.up

    @property
    def down_reason(self) -> str:
        return self._conn.down_reason

    @property
    def offered(self) -> list[Tool]:
        return list(self._tools.values())

    def redefined(self) -> list[str]:
        """The registered names whose definition changed since this process first
        offered them (the server redefined them while it ran)."""
        return sorted(d.name for d in self._loaded.values() if self._first.get(d.name) != d.hash)

    def load_error(self, exc: BaseException) -> BaseException:
        """``exc`` (from connecting or listing) as the one-line ``McpLoadError`` it means;
        any other exception as it is."""
        if isinstance(exc, McpLoadError):
            return exc
        if isinstance(exc, McpNotAuthorized):  # its OAuth got no token
            return self._load_error(f"is {self._detail(exc)}")
        if isinstance(exc, McpUnauthorized):  # reached: it says why it refuses
            return self._load_error(f"answered {self._detail(exc)}")
        if isinstance(exc, McpUnavailable | TimeoutError):
            return self._load_error(f"unreachable at startup: {self._detail(exc)}")
        if isinstance(exc, ToolError):
            return self._load_error(f"cannot list its tools: {self._detail(exc)}")
        return exc

    async def current_definitions(self) -> dict[str, str]:
        """``{registered name: definition hash}`` as the server defines its tools now."""
        offered, _ = self._select(await self._list())
        return {d.name: d.hash for d in offered}

    def _check_allowlist(self, listed: list[types.Tool]) -> None:
        missing = self._missing(listed)
        if missing:
            text = ", ".join(repr(n) for n in missing)
            raise self._load_error(f"has no tool {text} (named in its tools allowlist)")

    def _missing(self, listed: list[types.Tool]) -> list[str]:
        names = {t.name for t in listed}
        return [n for n in self.server.tools or () if n not in names]

    def _apply(self, listed: list[types.Tool]) -> None:
        """Offer what ``listed`` defines: an unchanged definition keeps its Tool (and its
        hash), a changed one gets a new Tool, and the registry (when serving) gets them
        all in one swap. A name another source holds is left out, with one line."""
        offered, left_out = self._select(listed)
        left_out += [(n, "named in its tools allowlist, not listed") for n in self._missing(listed)]
        tools: dict[str, Tool] = {}
        loaded: dict[str, _Definition] = {}
        for d in offered:
            before = self._loaded.get(d.remote)
            same = before is not None and before.hash == d.hash
            tool = self._tools.get(d.remote) if same else None
            if tool is None:
                try:
                    tool = self._tool(d)
                except ToolDefinitionError as exc:  # a schema opsloop cannot run safely
                    left_out.append((d.remote, str(exc)))
                    continue
            tools[d.remote], loaded[d.remote] = tool, d
        if self.registry is not None:
            for tool, why in self.registry.replace_source(self.name, tools.values()):
                left_out.append((tool.source_name, why))
                del tools[tool.source_name], loaded[tool.source_name]
        self._log_changes(loaded)
        self._loaded, self._tools = loaded, tools
        for d in loaded.values():
            self._first.setdefault(d.name, d.hash)
        before_left_out, self.left_out = set(self.left_out), []
        for remote, reason in left_out:
            line = f"{remote!r}: {self.server.redact(reason)}"
            if line not in before_left_out:  # once, not at every refresh
                log.warning(
                    "mcp tool left out server=%s tool=%s reason=%s",
                    self.server_name,
                    remote,
                    self.server.redact(reason),
                )
            self.left_out.append(line)

    def _log_changes(self, loaded: dict[str, _Definition]) -> None:
        old = self._loaded
        if not old:
            return  # the first listing: nothing changed
        added = sorted(d.name for r, d in loaded.items() if r not in old)
        removed = sorted(d.name for r, d in old.items() if r not in loaded)
        changed = sorted(d.name for r, d in loaded.items() if r in old and old[r].hash != d.hash)
        if added or removed or changed:
            log.info(
                "mcp tools changed server=%s added=%s changed=%s removed=%s",
                self.server_name,
                ",".join(added) or "-",
                ",".join(changed) or "-",
                ",".join(removed) or "-",
            )

    def _select(self, listed: list[types.Tool]) -> tuple[list[_Definition], list[tuple[str, str]]]:
        """The wanted tools the model can be offered, and (tool, why) for each other one.

        Two tools whose names map to one registered name: the one named so by the server
        keeps it (a name that needs no mapping never changes), the others are left out."""
        by_remote = {t.name: self._definition(t) for t in listed}  # the last of a name
        wanted = [d for d in by_remote.values() if self._wanted(d)]
        left_out = [(d.remote, d.unfit) for d in wanted if d.unfit is not None]
        fit = [d for d in wanted if d.unfit is None]
        sharing: defaultdict[str, list[_Definition]] = defaultdict(list)
        for d in fit:
            sharing[d.name].append(d)
        offered = []
        for d in fit:
            others = [o.remote for o in sharing[d.name] if o is not d]
            if not others or d.name == f"mcp__{self.server_name}__{d.remote}":
                offered.append(d)
                continue
            names = " and ".join(repr(n) for n in sorted([d.remote, *others]))
            verb = "both map" if len(others) == 1 else "all map"
            left_out.append((d.remote, f"tools {names} {verb} to the name {d.name!r}"))
        return offered, left_out

    def _tool(self, d: _Definition) -> Tool:
        async def call_mcp_tool(args: SchemaArguments, ctx: Any) -> Any:
            return await self._call(d, args.as_dict(), ctx)

        return schema_tool(
            name=d.name,
            description=d.description,
            schema=d.schema,
            func=call_mcp_tool,
            policy="approve_before_run",
            source=self.name,
            idempotent=False,
            annotations=d.annotations,
            checks=d.checks,
            source_name=d.remote,
        )

    async def _call(self, d: _Definition, arguments: dict[str, Any], ctx: Any) -> Any:
        """Run the tool ``d`` defines, if the server still defines it as the call was
        requested (``ctx.definition_hash``; else as ``d``): its output, or the durable
        wait of a question the server asks first (tools/mcp/elicitation.py). An attempt
        handed the answer (``ctx.answer``) goes on with it: in the session still holding
        the call (classic), or by sending the call again (input required)."""
        answer = getattr(ctx, "answer", None)
        asked = question_of(answer.data) if answer is not None else None
        thread, call_id = getattr(ctx, "thread_id", ""), getattr(ctx, "tool_call_id", "")
        try:
            if asked is not None and asked.kind == "classic":
                return await self._resume_in_session(d, asked, answer)
            responses, state = None, None
            if asked is not None and answer is not None:  # input required: next question, or again
                answers = {
                    **asked.answers,
                    asked.key: answer_of(answer.result, timed_out=answer.timed_out),
                }
                if asked.pending:
                    again = next_question(
                        asked.pending, answers, state=asked.request_state, **self._asker(d)
                    )
                    return wait_for(again, self.server.input_required_timeout)
                responses = {k: elicit_result(v) for k, v in answers.items()}
                state = asked.request_state
            await self._check_definition(d, ctx)

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                self.progress.report(thread, call_id, progress, total, message)

            send = partial(
                send_call,
                name=d.remote,
                arguments=arguments,
                timeout_s=self.call_timeout_s,
                progress=on_progress,
                responses=responses,
                state=state,
            )
            return self._outcome(d, await self._conn.request(send, call=d.remote))
        finally:
            self.progress.done(thread, call_id)

    async def _resume_in_session(self, d: _Definition, asked: Question, answer: Any) -> Any:
        """Hand the answer to the session still holding the call (in this process), and
        await the call. The session gone (a restart, another process), nobody can say
        what the call did: its outcome is unknown (an idempotent call is simply run again)."""
        result = elicit_result(answer_of(answer.result, timed_out=answer.timed_out))
        try:
            out = await self._conn.resume(asked.ask_id, result)
        except QuestionGone:
            raise OutcomeUnknown(
                f"{d.name} asked a question in an MCP session that is gone (opsloop "
                "restarted, or another process runs the thread now): the answer could not "
                "be given, and whether the call did anything is unknown"
            ) from None
        return self._outcome(d, out)

    def _outcome(self, d: _Definition, out: Any) -> Any:
        """A call's output, or the wait for the question it asks."""
        if isinstance(out, Asking):
            asked = question(out.params, **self._asker(d), kind="classic", ask_id=out.ask_id)
            return wait_for(asked, self.server.elicitation_timeout)
        if isinstance(out, types.InputRequiredResult):
            first = first_question(out, **self._asker(d))
            return wait_for(first, self.server.input_required_timeout)
        return tool_output(out, self.server.redact)

    def _asker(self, d: _Definition) -> dict[str, Any]:
        return {"server": self.server_name, "tool": d.name, "redact": self.server.redact}

    async def _check_definition(self, d: _Definition, ctx: Any) -> None:
        """Refuse the call (``DefinitionChanged``) unless the server defines the tool as
        the call was requested (``ctx.definition_hash``; else as ``d``)."""
        remote = d.remote
        pinned = getattr(ctx, "definition_hash", None) or d.hash
        current = next((t for t in await self._list(until=remote) if t.name == remote), None)
        now = self._definition(current) if current is not None else None
        offered = self._loaded.get(remote)
        if now is None or offered is None or now.hash != offered.hash:
            # What is offered is not what the server defines: offer that from now on
            # (the next decision sees it); this call stays refused below if it differs.
            await self._refresh_quietly()
        if now is None:
            raise DefinitionChanged(
                f"{d.name} is no longer offered by MCP server {self.server_name!r} "
                "since the call was approved; it was not run"
            )
        if now.hash != pinned:
            raise DefinitionChanged(
                f"the definition of {d.name} changed since the call was approved "
                f"({_what_changed(d, now, pinned)}); it was not run"
            )

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except (ToolError, TimeoutError) as exc:  # the call's own answer says enough
            log.warning(
                "mcp tools not refreshed server=%s reason=%s", self.server_name, self._detail(exc)
            )

    async def _list(self, *, until: str | None = None) -> list[types.Tool]:
        """A fresh ``tools/list``, page after page (up to the page naming ``until``)."""

        async def walk(client: Client) -> list[types.Tool]:
            tools: list[types.Tool] = []
            cursor: str | None = None
            for _ in range(_MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None or any(t.name == until for t in page.tools):
                    break
            return tools

        return await self._conn.request(walk)

    def _definition(self, remote: types.Tool) -> _Definition:
        description = (remote.description or remote.title or "").strip()
        hints = (
            remote.annotations.model_dump(by_alias=True, exclude_none=True)
            if remote.annotations
            else {}
        )
        raw = remote.input_schema
        try:
            schema, unfit = fit_for_the_model(raw), None
        except Unfit as exc:
            schema, unfit = object_schema(raw), str(exc)
        flattened = unfit is None and any(word in raw for word in COMBINATORS)
        if remote.execution is not None and remote.execution.task_support == "required":
            unfit = _NEEDS_TASKS
        return _Definition(
            remote=remote.name,
            name=registered_name(self.server_name, remote.name),
            description=description or f"Tool {remote.name} of the MCP server {self.server_name}.",
            schema=schema,
            annotations={k: v for k, v in hints.items() if k.endswith("Hint")},
            checks=dict(raw) if flattened else None,
            unfit=unfit,
        )

    def _wanted(self, d: _Definition) -> bool:
        return self.server.tools is None or d.remote in self.server.tools

    def _load_error(self, text: str) -> McpLoadError:
        return McpLoadError(
            self.server_name, self.server.redact(f"MCP server {self.server_name!r} {text}")
        )

    def _detail(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        return text.removeprefix(f"MCP server {self.server_name!r}: ")


async def current_definitions(source: McpSource) -> dict[str, str]:
    """For ``opsloop tools``: the hashes the server's tools have now.

    A tool whose hash differs from its ``Tool.definition_hash`` has drifted; a name
    missing from the answer was removed by the server.
    """
    return await source.current_definitions()


def object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema as ``schema_tool`` shows it to the model (so hashes agree)."""
    out = dict(schema)
    out["type"] = "object"
    out.setdefault("properties", {})
    return out


def definition_hash(name: str, description: str, schema: dict[str, Any]) -> str:
    """Tool.definition_hash of a tool with this definition, without building its validator."""
    probe = Tool(
        name=name,
        description=description.strip(),
        policy="approve_before_run",
        args_model=SchemaArguments,
        func=_never_called,
        source="mcp",
    )
    probe.use_schema(object_schema(schema))
    return probe.definition_hash


async def _never_called(args: SchemaArguments, ctx: Any) -> None:
    raise AssertionError("a definition probe is never run")


def _what_changed(loaded: _Definition, now: _Definition, pinned: str) -> str:
    if pinned != loaded.hash:
        return "it no longer matches the approved definition"
    parts = [
        label
        for label, before, after in (
            ("description", loaded.description, now.description),
            ("input schema", loaded.schema, now.schema),
        )
        if before != after
    ]
    return " and ".join(parts) + " changed" if parts else "its definition changed"
