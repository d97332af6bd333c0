"""A tool call that asks the requester a question, in the MCP SDK's terms: the
``tools/call`` as sent (progress token, answers and echoed state), the questions an
``InputRequiredResult`` or an ``elicitation/create`` carries, as the waits
``tools.mcp.elicitation`` describes, and the answers back to the SDK's types.

An ``InputRequiredResult`` may ask several questions at once: they are put to the
person one after the other (each a wait of its own, the others ``pending`` in its
data), and the call is sent again once every one is answered. One that carries only
``request_state`` (no question) is sent again at once, after a short backoff, as the
SDK's own driver does; a question of another kind (sampling, roots: capabilities
opsloop does not declare) fails the call, which has not run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from mcp import Client, MCPError
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import HEADER_MISMATCH
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from tools.errors import ToolError
from tools.mcp.elicitation import Mode, Question, answer_of
from tools.wait import WaitFor

_PARAMS: TypeAdapter[types.ElicitRequestParams] = TypeAdapter(types.ElicitRequestParams)
_STATE_ONLY_ROUNDS = 10  # as the SDK's driver: a server that never asks nor answers stops
_STATE_ONLY_BACKOFF_S = (0.05, 0.25)
_MAX_PAGES = 100


async def send_call(
    client: Client,
    name: str,
    arguments: dict[str, Any],
    *,
    timeout_s: float | None,
    progress: ProgressFnT,
    responses: dict[str, types.ElicitResult] | None = None,
    state: str | None = None,
) -> types.CallToolResult | types.InputRequiredResult:
    """``tools/call`` ``name`` once (with a progress token, and the answers and state
    of an earlier round), as many times as a state-only ``InputRequiredResult`` asks;
    a result that asks questions is returned for a person to answer."""
    delay = _STATE_ONLY_BACKOFF_S[0]
    for _ in range(_STATE_ONLY_ROUNDS):
        result = await _call_once(client, name, arguments, timeout_s, progress, responses, state)
        if not isinstance(result, types.InputRequiredResult) or result.input_requests:
            return result
        await anyio.sleep(delay)
        delay = min(delay * 2, _STATE_ONLY_BACKOFF_S[1])
        responses, state = None, result.request_state
    raise ToolError(
        f"the MCP server answered {name} with input_required {_STATE_ONLY_ROUNDS} times "
        "without asking anything"
    )


async def _call_once(
    client: Client,
    name: str,
    arguments: dict[str, Any],
    timeout_s: float | None,
    progress: ProgressFnT,
    responses: dict[str, types.ElicitResult] | None,
    state: str | None,
) -> types.CallToolResult | types.InputRequiredResult:
    async def send() -> types.CallToolResult | types.InputRequiredResult:
        return await client.session.call_tool(
            name,
            arguments,
            read_timeout_seconds=timeout_s,
            progress_callback=progress,
            input_responses=None if responses is None else _responses(responses),
            request_state=state,
            allow_input_required=True,
        )

    try:
        return await send()
    except MCPError as exc:
        # A 2026-07-28 server that holds our listing of the tool stale: list it again and
        # send once more (what Client.call_tool does, which would answer questions itself).
        if exc.code != HEADER_MISMATCH or client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            raise
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            cursor = page.next_cursor
            if cursor is None or any(t.name == name for t in page.tools):
                break
        return await send()


def _responses(answers: dict[str, types.ElicitResult]) -> types.InputResponses:
    return dict(answers.items())


def question(
    params: types.ElicitRequestParams,
    *,
    server: str,
    tool: str,
    redact: Callable[[str], str],
    **where: Any,
) -> Question:
    """The question ``params`` asks (``where``: its ``kind`` and how to find it again)."""
    mode: Mode = "url"
    schema: dict[str, Any] = {}
    url = getattr(params, "url", None)
    if isinstance(params, types.ElicitRequestFormParams):
        mode, schema = "form", dict(params.requested_schema)
    return Question(
        mode=mode,
        message=redact(params.message),
        server=server,
        tool=tool,
        schema=schema,
        url=url,
        **where,
    )


def first_question(
    result: types.InputRequiredResult, *, server: str, tool: str, redact: Callable[[str], str]
) -> Question:
    """The first question of a round; the others pending behind it. ``ToolError`` for a
    request of another kind than elicitation."""
    pending: dict[str, dict[str, Any]] = {}
    for key, request in (result.input_requests or {}).items():
        if not isinstance(request, types.ElicitRequest):
            raise ToolError(
                f"the MCP server asked for {request.method} to run {tool}, which opsloop "
                "does not offer; it was not run"
            )
        pending[key] = request.params.model_dump(by_alias=True, mode="json", exclude_none=True)
    return next_question(
        pending, {}, state=result.request_state, server=server, tool=tool, redact=redact
    )


def next_question(
    pending: dict[str, dict[str, Any]],
    answers: dict[str, dict[str, Any]],
    *,
    state: str | None,
    server: str,
    tool: str,
    redact: Callable[[str], str],
) -> Question:
    """The next of a round's ``pending`` questions (not empty), the round so far kept."""
    key, *rest = pending
    params = _PARAMS.validate_python(pending[key])
    return question(
        params,
        server=server,
        tool=tool,
        redact=redact,
        kind="input_required",
        key=key,
        request_state=state,
        pending={k: pending[k] for k in rest},
        answers=answers,
    )


def elicit_result(answer: dict[str, Any]) -> types.ElicitResult:
    """An answer (``elicitation.answer_of``) as the SDK sends it; one whose content the
    protocol does not take (a hand-made webhook body) is a cancel."""
    try:
        return types.ElicitResult.model_validate(answer)
    except ValidationError:
        return types.ElicitResult.model_validate(answer_of({}))


def wait_for(asked: Question, timeout_s: float) -> WaitFor:
    """The durable wait of a call that asks ``asked``."""
    return WaitFor(
        description=f"an answer to the question {asked.tool} asked",
        data=asked.data(),
        timeout_s=timeout_s,
        resumes=True,
    )
