"""A question an MCP server asks the requester in the middle of a tool call
(elicitation), as opsloop keeps it in the log.

A server asks in one of two ways:

- ``classic``: an ``elicitation/create`` request on a handshake-era session, sent while
  its ``tools/call`` is in flight. The session must stay open until the answer comes
  (``elicitation_timeout``, 10 minutes by default), and the answer goes back to the
  request still waiting in the process that holds the session (tools/mcp/connection.py).
- ``input_required``: a 2026-07-28 server answers the call with an
  ``InputRequiredResult`` (questions by key, and an opaque ``request_state``). Nothing
  is held open: the call is sent again with the answers and the state echoed
  byte-exact, by whichever process runs the thread next, after any restart.

Either way the attempt ends in a durable wait (``WaitFor(resumes=True)``) whose
``data[DATA_KEY]`` is :meth:`Question.data`. The front door shows it
(bot/render/elicitation.py) and records the answer as ``wait_finished`` with
``{"action": "accept", "content": {…}}``, ``{"action": "decline"}`` or
``{"action": "cancel"}``; an expiry is ``wait_timed_out``, answered to the server as
cancel. The call's next attempt is handed how the wait ended (``ToolContext.answer``).

Pure: no I/O, and no import of the MCP SDK (the front door reads this module too).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

DATA_KEY = "elicitation"
Kind = Literal["classic", "input_required"]
Mode = Literal["form", "url"]
Action = Literal["accept", "decline", "cancel"]
ACTIONS: tuple[Action, ...] = ("accept", "decline", "cancel")


@dataclass(frozen=True)
class Question:
    """One question of a tool call, as its wait's data holds it.

    ``schema``: the requested JSON Schema (form mode); ``url``: where to send the person
    (url mode). ``server`` is the key of the MCP server, ``tool`` the registered name of
    the tool that asked. Classic: ``ask_id`` names the question waiting in the process
    that holds the session. Input required: ``key`` is the question's key among the
    round's input requests, ``request_state`` the server's opaque state, ``pending``
    the round's other questions still to ask (by key, as the server sent them) and
    ``answers`` the round's answers so far (by key).
    """

    kind: Kind
    mode: Mode
    message: str
    server: str
    tool: str
    schema: dict[str, Any] = field(default_factory=dict)
    url: str | None = None
    ask_id: str = ""
    key: str = ""
    request_state: str | None = None
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        """What the wait's ``data`` holds (JSON)."""
        return {DATA_KEY: asdict(self)}


def question_of(data: Mapping[str, Any] | None) -> Question | None:
    """The question a wait's ``data`` holds; None for any other wait (or a malformed
    one: the front door shows it as an ordinary wait rather than failing)."""
    raw = data.get(DATA_KEY) if isinstance(data, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    kind, mode = raw.get("kind"), raw.get("mode")
    message, server, tool = raw.get("message"), raw.get("server"), raw.get("tool")
    if kind not in ("classic", "input_required") or mode not in ("form", "url"):
        return None
    if not (isinstance(message, str) and isinstance(server, str) and isinstance(tool, str)):
        return None
    schema, url, state = raw.get("schema"), raw.get("url"), raw.get("request_state")
    pending, answers = raw.get("pending"), raw.get("answers")
    return Question(
        kind=kind,
        mode=mode,
        message=message,
        server=server,
        tool=tool,
        schema=dict(schema) if isinstance(schema, Mapping) else {},
        url=url if isinstance(url, str) else None,
        ask_id=str(raw.get("ask_id") or ""),
        key=str(raw.get("key") or ""),
        request_state=state if isinstance(state, str) else None,
        pending=_objects(pending),
        answers=_objects(answers),
    )


def _objects(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): dict(v) for k, v in value.items() if isinstance(v, Mapping)}


def answer_of(result: Mapping[str, Any], *, timed_out: bool = False) -> dict[str, Any]:
    """The answer to give the server, from how the wait ended: ``{"action": …}`` with
    ``content`` for an accepted form. An expiry, or a result that is none of the three
    actions (a hand-made webhook body), is a cancel: nobody chose."""
    action = None if timed_out else result.get("action")
    if action == "accept":
        content = result.get("content")
        return {"action": "accept", **({"content": content} if isinstance(content, dict) else {})}
    if action == "decline":
        return {"action": "decline"}
    return {"action": "cancel"}


def fill_defaults(schema: Mapping[str, Any], content: Mapping[str, Any]) -> dict[str, Any]:
    """``content`` with each property the form left out set to its schema ``default``
    (SEP-1034: a client that accepts applies the defaults; the conformance scenario
    ``elicitation-sep1034-client-defaults`` checks it)."""
    out = dict(content)
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return out
    for name, prop in properties.items():
        if name not in out and isinstance(prop, Mapping) and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
    return out
