"""An offline model that understands a few phrases: ``opsloop local`` without Claude.

Stateless like ``ScriptedModel``: each step is chosen from the prompt alone (the latest
thing a person said, and the tool calls and results after it), so a process that
restarts mid-thread carries on from the right place. Its phrases walk every path of
the product: a lookup, an approval, a clarification, a wait, a retry and an answer; with
local mode's own opsloop.yaml, a deploy through CI (GitHub Actions, waited for), an
approval only whoever is on call may give (PagerDuty), an alert's thread, and a run of
three steps (one plan) that opsloop itself may be killed in the middle of.

Pure: no I/O here.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, cast

from engine.context import Prompt
from engine.events import CLARIFICATION_TOOL, Usage
from engine.models.base import Decision, TextSink, ToolUse, hand_over

PHRASEBOOK: list[tuple[str, str]] = [
    ("look up rollback", "searches the docs (search_docs, runs at once) and sums up the hits"),
    ("deploy api to staging", "deploys after a reviewer approves the card (deploy)"),
    (
        "deploy api version 1.4.2 to production",
        "the same to production: a rule needs 2 approvals, bob's and carol's",
    ),
    ("deploy", "asks which service first, then deploys the one you name in your reply"),
    ("run the backfill job for 20 seconds", "starts a job and waits until it is done (run_job)"),
    ("check health of api", "fails once, is retried by the engine, then reports (check_health)"),
    ("list services", "reads the service catalog, an MCP server a rule lets run at once"),
    ("show service api", "one service from the catalog (MCP, runs at once)"),
    ("scale api to 5 replicas", "an MCP write: a reviewer approves it first"),
    (
        "scale api to 5 replicas and simulate a crash",
        "the catalog crashes mid-call: a reviewer says whether it happened",
    ),
    ("restart api", "an HTTP action with an idempotency key, after bob or carol approves"),
    (
        "look into api",
        "three read-only steps in one plan (the catalog, a health check, who is on call)",
    ),
    (
        "look into api and simulate a crash",
        "opsloop is killed during the health check: start it again, the same plan carries on",
    ),
    (
        "deploy api to staging through CI",
        "dispatches a GitHub Actions workflow after a reviewer approves, waits for its run",
    ),
    (
        "deploy api to production through CI",
        "the same to production: only whoever PagerDuty has on call (bob) may approve",
    ),
    ("who is on call", "asks PagerDuty who is on call now (runs at once)"),
    ("help", "lists these phrases"),
]

CATALOG = "mcp__catalog__"
LIST_SERVICES, GET_SERVICE, SCALE_SERVICE = (
    CATALOG + "list_services",
    CATALOG + "get_service",
    CATALOG + "scale_service",
)
RESTART_SERVICE = "restart_service"
DISPATCH, ONCALL = "github_dispatch_workflow", "pagerduty_oncall"
# The repository and workflow of local mode's GitHub (localslack/integrations.py).
CI_REPO, CI_WORKFLOW, CI_REF = "acme/platform", "deploy.yml", "main"
LOCAL_CONFIG = "opsloop local's own opsloop.yaml (localslack/opsloop.yaml)"

# Where each tool comes from, for the answer when one is not loaded.
TOOL_MODULES = {
    "search_docs": "tools.builtin",
    "deploy": "tools.demo",
    "run_job": "tools.demo",
    "check_health": "tools.demo",
}
TOOL_CONFIGS = {
    name: LOCAL_CONFIG
    for name in (LIST_SERVICES, GET_SERVICE, SCALE_SERVICE, RESTART_SERVICE, DISPATCH, ONCALL)
}

_I = re.IGNORECASE
_MENTION = re.compile(r"<@[A-Z0-9]+(?:\|[^>]*)?>")
# Emoji as Slack writes them (":pray:", ":pray::skin-tone-2:") or as typed (🙏🏽): noise
# around a phrase, like the politeness below.
_SHORTCODE = re.compile(r":[a-z0-9_+'-]+:")
_EMOJI_JOINERS = {"\u200d", "\ufe0e", "\ufe0f", "\u20e3"}
_PLEASE = r"(?:please|pls|plz|kindly)"
_POLITE_HEAD = re.compile(
    rf"^(?:(?:hey|hi|hello)\b[\s,]*)?(?:(?:{_PLEASE}|(?:can|could|would|will)\s+you)\b[\s,]*)+",
    _I,
)
_POLITE_TAIL = re.compile(
    rf"[\s,;:.!?-]*\b(?:{_PLEASE}|thanks?(?:\s+you)?|thx|ty|cheers)(?:\s+(?:a\s+lot|so\s+much))?"
    r"[\s.!?]*$",
    _I,
)
_END_PUNCTUATION = " .!?,;:"
ECHO_LIMIT = 200  # characters of a person's words quoted back in an answer
# How the projection shows what a person said: "[U123] text" (system notes are skipped).
_SPEAKER = re.compile(r"^\[(?P<actor>[^\]\s]+)\] ?(?P<body>.*)$", re.DOTALL)
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"

_HELP = re.compile(r"^(?:help|hi|hello|hey|\?|what can you do)$", _I)
_LOOKUP = re.compile(
    r"^(?:look\s*up|search\s+(?:the\s+)?docs?\s+(?:for|about)|search\s+for|search"
    r"|find\s+docs?\s+(?:on|about|for)|docs?\s+(?:on|about|for))\s+(?P<query>.+)$",
    _I,
)
_DEPLOY = re.compile(r"^(?:deploy|ship)\b(?P<rest>.*)$", _I | re.DOTALL)
# "… through CI": a GitHub Actions workflow rather than the demo's deploy tool.
_THROUGH_CI = re.compile(
    r"\s+(?:through|via|using|with|on|in)\s+(?:the\s+)?"
    r"(?:ci|github(?:\s+actions)?|actions|(?:a\s+|the\s+)?(?:deploy\s+)?workflow)\b",
    _I,
)
_ONCALL = re.compile(r"^(?:who(?:'s|\s+is)\s+)?on[\s-]?call(?:\s+now|\s+right\s+now)?$", _I)
# How engine.context begins an alert's input ("[alert:<source>] An alert fired …").
_ALERT = re.compile(
    r"^(?:An alert fired and opened this thread|The alert this thread is about "
    r"(?:fired again|has resolved))\."
)
_ENV = re.compile(r"\b(?:to|in|on|into)\s+(?:the\s+)?(?P<env>[\w-]+)(?:\s+env(?:ironment)?)?\b", _I)
_VERSION = re.compile(
    r"(?:\bversion\s+|\bv|@)(?P<v>\d[\w.+-]*)|\b(?P<bare>\d+(?:\.\d+)+[\w.+-]*)", _I
)
_ENVS = {
    "staging": "staging",
    "stage": "staging",
    "stg": "staging",
    "production": "production",
    "prod": "production",
    "prd": "production",
}
_NOT_A_SERVICE = {"the", "a", "an", "service", "app", "version", "now", "please", "to", "of"}
_JOB = re.compile(
    rf"^run\s+(?:the\s+|a\s+)?(?:job\s+)?(?P<name>{_NAME})(?:\s+job)?"
    r"(?:\s+for\s+(?P<n>\d+)\s*(?P<unit>s|secs?|seconds?|m|mins?|minutes?)?)?$",
    _I,
)
_HEALTH = [
    re.compile(
        rf"^(?:check\s+)?(?:the\s+)?health\s+(?:of|for|on)\s+(?:the\s+)?(?P<s>{_NAME})$", _I
    ),
    re.compile(rf"^(?:check\s+)?(?:the\s+)?(?P<s>{_NAME})(?:'s)?\s+health(?:\s*check)?$", _I),
    re.compile(rf"^health\s*check\s+(?:of\s+)?(?P<s>{_NAME})$", _I),
    re.compile(rf"^is\s+(?:the\s+)?(?P<s>{_NAME})\s+(?:healthy|up|ok|alive)$", _I),
]
_LIST_SERVICES = re.compile(r"^(?:list|show)\s+(?:the\s+|all\s+)?(?:services|catalog)$", _I)
_GET_SERVICE = [
    re.compile(rf"^(?:show|get|describe)\s+(?:the\s+)?service\s+(?P<s>{_NAME})$", _I),
    re.compile(rf"^who\s+owns\s+(?:the\s+)?(?P<s>{_NAME})(?:\s+service)?$", _I),
]
_SCALE = re.compile(
    rf"^scale\s+(?:the\s+)?(?P<s>{_NAME})(?:\s+service)?\s+(?:to|up\s+to|down\s+to)\s+"
    r"(?P<n>\d{1,3})(?:\s+replicas?)?"
    r"(?P<crash>[\s,]+(?:and\s+)?(?:simulate|fake)\s+a\s+crash)?$",
    _I,
)
_RESTART = re.compile(rf"^restart\s+(?:the\s+)?(?P<s>{_NAME})(?:\s+service)?$", _I)
# "look into api": three read-only calls in one run, then one answer (a plan of three
# task cards); "… and simulate a crash": the health check kills opsloop on its first try.
_LOOK_INTO = re.compile(
    rf"^(?:look\s+into|investigate|triage)\s+(?:the\s+)?(?P<s>{_NAME})(?:\s+service)?"
    r"(?P<crash>[\s,]+(?:and\s+)?(?:simulate|fake)\s+a\s+crash)?$",
    _I,
)
_NEVER_MIND = re.compile(r"^(?:no|nope|cancel|never\s*mind|stop|abort|forget it)\b", _I)
DEFAULT_JOB_SECONDS = 10
# How engine.context answers a call a person said did not happen ("Not run: <@U1> says …").
_DID_NOT_HAPPEN = "says it did not happen"


@dataclass(frozen=True)
class _Call:
    """A tool_use after the request, with the text of its tool_result once answered."""

    id: str
    name: str
    input: dict[str, Any]
    result: str | None = None
    is_error: bool = False


@dataclass(frozen=True)
class _Step:
    """What to do next: a final ``text``, or ``tool(input)`` with ``text`` beside it."""

    text: str
    tool: str | None = None
    input: dict[str, Any] | None = None
    understood: bool = True


@dataclass(frozen=True)
class _Reading:
    """What the prompt says: the latest ``request`` of a person, the ``calls`` made for
    it, and a result nobody has reported yet because people spoke right after it."""

    request: str = ""
    calls: tuple[_Call, ...] = ()
    unreported: tuple[str, _Call] | None = None


class PhrasebookModel:
    """The offline model: a few phrases (``PHRASEBOOK``), decided from the prompt only."""

    name = "offline phrasebook"

    async def next_step(self, prompt: Prompt, *, on_text: TextSink | None = None) -> Decision:
        step = _next(_read(prompt.messages), {t.get("name") for t in prompt.tools})
        if step.tool is None:
            answer = Decision(
                text=step.text, stop_reason="end_turn", usage=Usage(), model=self.name
            )
            return await hand_over(answer, on_text)
        turn = prompt.turn if prompt.turn >= 0 else _assistant_turns(prompt)
        # The id makes the idempotency key, so it must be the same on a replay and new
        # for each decision of the thread: the decision count gives both.
        use = ToolUse(id=f"toolu_offline_{turn:04d}", name=step.tool, input=step.input or {})
        return Decision(
            text=step.text, tool_use=use, stop_reason="tool_use", usage=Usage(), model=self.name
        )

    async def close(self) -> None:
        """Nothing to release."""


def _read(messages: list[dict[str, Any]]) -> _Reading:
    """Walk the conversation once, keeping what the next step depends on."""
    request, calls = "", cast(tuple[_Call, ...], ())
    unreported: tuple[str, _Call] | None = None
    for message in messages:
        if message.get("role") == "assistant":
            unreported = None  # the model has spoken since any earlier result
        for block in message.get("content") or []:
            kind = block.get("type")
            if message.get("role") == "user" and kind == "text":
                said = _person_said(block.get("text", ""))
                if said is not None:
                    request, calls = said, ()
            elif kind == "tool_use":
                calls = (*calls, _Call(block["id"], block["name"], dict(block.get("input") or {})))
            elif kind == "tool_result":
                calls = tuple(_answered(c, block) for c in calls)
                done = [c for c in calls if c.id == block.get("tool_use_id")]
                unreported = (request, done[0]) if done else unreported
    return _Reading(request, calls, unreported)


def _answered(call: _Call, block: dict[str, Any]) -> _Call:
    if call.id != block.get("tool_use_id"):
        return call
    return _Call(call.id, call.name, call.input, _text_of(block), bool(block.get("is_error")))


def _next(reading: _Reading, tools: set[str | None]) -> _Step:
    if reading.calls:
        if look := _LOOK_INTO.match(_clean(reading.request)):
            return _look_into(look, reading.calls, tools)
        return _follow_up(reading.request, reading.calls[-1], tools)
    step = _start(reading.request, tools)
    if reading.unreported is None or not _came_back(reading.unreported[1]):
        # Nothing to report, or a call that never ran (cancelled, rejected, expired):
        # its story is told on its card, and this text is the next card's Why.
        return step
    # Someone spoke while a call ran (or right after): report its result first.
    report = _follow_up(*reading.unreported, tools)
    if report.tool is not None:
        return report  # the earlier request is not done yet (a reply led to a deploy)
    if not step.understood:
        short = _cut(_clean(reading.request), 80)
        return _Step(f"{report.text}\n(I didn't catch “{short}”; say `help` for what I know.)")
    return _Step(f"{report.text}\n\n{step.text}".strip(), step.tool, step.input)


# How the projection words the end of a call that never ran (engine/context.py).
_NEVER_RAN = (
    "Not run:",
    "Reviewer ",
    "Nobody approved",
    "opsloop error:",
    "Rejected by validation",
)


def _came_back(call: _Call) -> bool:
    """Whether ``call`` ran and answered (a result, or the tool's own failure)."""
    if call.result is None:
        return False
    return not (call.is_error and call.result.startswith(_NEVER_RAN))


def _person_said(text: str) -> str | None:
    match = _SPEAKER.match(text)
    if match is None:
        return None if text.startswith("[") else text  # a summary or a note: not a request
    return None if match["actor"] == "system" else match["body"]


def _text_of(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content or "")


def _assistant_turns(prompt: Prompt) -> int:
    return sum(1 for m in prompt.messages if m.get("role") == "assistant")


def _clean(text: str) -> str:
    """Without the bot's mention, emoji, politeness and end punctuation; spaces collapsed.

    Politeness alone ("thanks") stays, so that it is answered as itself."""
    bare = _flat(_without_emoji(_MENTION.sub(" ", text)))
    phrase = bare
    while True:
        shorter = _POLITE_TAIL.sub("", _POLITE_HEAD.sub("", phrase)).strip(_END_PUNCTUATION)
        if shorter == phrase:
            return phrase or bare
        phrase = shorter


def _flat(text: str) -> str:
    return " ".join(text.split()).strip(_END_PUNCTUATION)


def _without_emoji(text: str) -> str:
    text = _SHORTCODE.sub(" ", text)
    return "".join(
        " " if unicodedata.category(ch) in ("So", "Sk", "Cs") or ch in _EMOJI_JOINERS else ch
        for ch in text
    )


def _echo(text: str | None) -> str:
    """A person's words quoted back: on one line, at most ``ECHO_LIMIT`` characters."""
    return _cut(text, ECHO_LIMIT)


# --- the first step of a request --------------------------------------------------------


def _start(request: str, tools: set[str | None]) -> _Step:
    if (alert := _alert(request)) is not None:
        return _alert_step(alert, tools)
    text = _clean(request)
    if not text or _HELP.match(text):
        return _Step(help_text())
    if look := _LOOK_INTO.match(text):
        return _look_into(look, (), tools)
    if m := _LOOKUP.match(text):
        query = m["query"].strip(" ?\"'“”")
        text = f"Searching the docs for “{_echo(query)}”."
        return _use(tools, "search_docs", {"query": query}, text)
    if (m := _DEPLOY.match(text)) and (ci := _THROUGH_CI.search(m["rest"])):
        rest = m["rest"][: ci.start()] + " " + m["rest"][ci.end() :]
        return _ci_step(_parse_deploy(rest), tools)
    if m := _DEPLOY.match(text):
        return _deploy_step(_parse_deploy(m["rest"]), tools)
    if _ONCALL.match(text.rstrip("?")):
        return _use(tools, ONCALL, {}, "Asking PagerDuty who is on call now.")
    if m := _JOB.match(text):
        return _job_step(m, tools)
    for pattern in _HEALTH:
        m = pattern.match(text.rstrip("?"))
        if m and m["s"].lower() not in ("check", "health"):
            service = m["s"].lower()
            return _use(tools, "check_health", {"service": service}, f"Checking {_echo(service)}.")
    if (catalog := _catalog_step(text, tools)) is not None:
        return catalog
    # The phrases without what each does (`help` says): a short answer to a typo.
    known = ", ".join(f"`{phrase}`" for phrase, _ in PHRASEBOOK)
    return _Step(
        f"I didn't catch “{_cut(text, 80)}”. I know these phrases (`help` says what each "
        f"does): {known}.",
        understood=False,
    )


def _catalog_step(text: str, tools: set[str | None]) -> _Step | None:
    """The service catalog (MCP) and the platform API (an HTTP action), or None."""
    if _LIST_SERVICES.match(text):
        return _use(tools, LIST_SERVICES, {}, "Reading the service catalog.")
    for pattern in _GET_SERVICE:
        if m := pattern.match(text):
            service = m["s"].lower()
            return _use(tools, GET_SERVICE, {"service": service}, f"Looking up {_echo(service)}.")
    if m := _SCALE.match(text):
        service, replicas = m["s"].lower(), int(m["n"])
        args: dict[str, Any] = {"service": service, "replicas": replicas}
        # "once it is approved": the card says by whom and how many (a rule may need 2).
        what = f"Scaling {_echo(service)} to {_replicas(replicas)}, once it is approved."
        if m["crash"]:
            args["simulate_crash"] = True
            what += (
                " The catalog will crash right after making the change, before it answers:"
                f" a reviewer says what happened (`show service {_echo(service)}` in a new"
                " message shows what the catalog has)."
            )
        return _use(tools, SCALE_SERVICE, args, what)
    if m := _RESTART.match(text):
        service = m["s"].lower()
        what = f"Restarting {_echo(service)}, once bob or carol approves."
        return _use(tools, RESTART_SERVICE, {"service": service}, what)
    return None


def help_text() -> str:
    lines = [f"• `{phrase}`: {what}" for phrase, what in PHRASEBOOK]
    head = "I'm the offline phrasebook (no ANTHROPIC_API_KEY is set), so I know these phrases:"
    return "\n".join([head, *lines])


def _use(tools: set[str | None], tool: str, args: dict[str, Any], text: str) -> _Step:
    if tool not in tools and tool in TOOL_CONFIGS:
        return _Step(
            f"I'd use the `{tool}` tool for that, but it isn't loaded here: it comes from "
            f"{TOOL_CONFIGS[tool]}, which local mode loads when neither OPSLOOP_CONFIG nor "
            "./opsloop.yaml names another file."
        )
    if tool not in tools:
        module = TOOL_MODULES.get(tool, "the module that defines it")
        return _Step(
            f"I'd use the `{tool}` tool for that, but it isn't loaded here. Add `{module}` "
            "to OPSLOOP_TOOLS (for example OPSLOOP_TOOLS=tools.builtin,tools.demo) and restart."
        )
    return _Step(text, tool, args)


@dataclass(frozen=True)
class _DeployRequest:
    service: str | None = None
    version: str | None = None
    environment: str | None = None
    unknown_environment: str | None = None


def _parse_deploy(rest: str) -> _DeployRequest:
    """``api version 1.4.2 to prod`` -> service, version and environment, as far as given."""
    env = unknown = None
    if m := _ENV.search(rest):
        word = m["env"].lower()
        env = _ENVS.get(word)
        unknown = None if env else word
        rest = rest[: m.start()] + " " + rest[m.end() :]
    version = None
    if m := _VERSION.search(rest):
        version = (m["v"] or m["bare"]).rstrip(".")
        rest = rest[: m.start()] + " " + rest[m.end() :]
    words = [w.lower() for w in re.findall(_NAME, rest) if w.lower() not in _NOT_A_SERVICE]
    return _DeployRequest(words[0] if words else None, version, env, unknown)


def _deploy_step(req: _DeployRequest, tools: set[str | None]) -> _Step:
    if req.unknown_environment:
        return _Step(
            f"I can deploy to staging or production, not “{_echo(req.unknown_environment)}”. "
            "Try `deploy api to staging`."
        )
    if req.service is None:
        if "deploy" not in tools:  # no point asking for a service we cannot deploy
            return _use(tools, "deploy", {}, "")
        question = "Which service should I deploy? Its name is enough, e.g. `api`."
        return _Step("", CLARIFICATION_TOOL, {"question": question})
    env = req.environment or "staging"
    args: dict[str, Any] = {"service": req.service, "environment": env}
    if req.version:
        args["version"] = req.version
    what = _echo(f"{req.service} {req.version}" if req.version else req.service)
    return _use(tools, "deploy", args, f"Deploying {what} to {env}, once it is approved.")


def _job_step(m: re.Match[str], tools: set[str | None]) -> _Step:
    seconds = int(m["n"]) if m["n"] else DEFAULT_JOB_SECONDS
    if (m["unit"] or "s").lower().startswith("m"):
        seconds *= 60
    if not 1 <= seconds <= 600:
        return _Step(
            "A demo job runs for 1 to 600 seconds: try `run the backfill job for 20 seconds`."
        )
    name = m["name"]
    text = f"Starting job {_echo(name)} for {seconds} s; I'll report back when it is done."
    return _use(tools, "run_job", {"name": name, "seconds": seconds}, text)


# --- after a tool call ------------------------------------------------------------------


def _follow_up(request: str, last: _Call, tools: set[str | None]) -> _Step:
    if last.result is None:  # not asked while a call is open; say so rather than guess
        return _Step(f"Still waiting for `{last.name}` to finish.")
    if last.name == CLARIFICATION_TOOL:
        return _after_clarification(request, last, tools)
    if last.name == "search_docs":
        return _Step(_search_summary(last))
    if last.name == "deploy":
        return _Step(_deploy_summary(last))
    if last.name == "run_job":
        return _Step(_job_summary(last))
    if last.name == "check_health":
        health = _health_summary(last)
        alert = _alert(request)
        return _Step(_after_alert(alert, health) if alert is not None else health)
    if last.name in SUMMARIES:
        return _Step(SUMMARIES[last.name](last))
    if last.is_error:
        return _Step(f"`{last.name}` failed:\n{_quote(last.result)}")
    return _Step(f"`{last.name}` returned: {_cut(last.result, 300)}")


def _after_clarification(request: str, last: _Call, tools: set[str | None]) -> _Step:
    if last.is_error:
        return _Step(f"I didn't get an answer, so I did nothing.\n{_quote(last.result)}")
    answer = _clean(_person_said(last.result or "") or "")
    if _NEVER_MIND.match(answer):
        return _Step("OK, I won't deploy anything.")
    m = _DEPLOY.match(_clean(request))
    asked = _parse_deploy(m["rest"] if m else "")
    given = _parse_deploy(answer)
    if given.service is None:
        return _Step("I still don't know which service to deploy. Try `deploy api to staging`.")
    return _deploy_step(
        _DeployRequest(
            given.service,
            given.version or asked.version,
            given.environment or asked.environment,
            given.unknown_environment or asked.unknown_environment,
        ),
        tools,
    )


def _json(text: str | None) -> dict[str, Any]:
    # A result may follow a line saying who edited the call's arguments before it ran.
    for candidate in (text or "", (text or "").partition("\n")[2]):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue  # an elided (cut) result is not JSON; callers fall back to the raw text
        return value if isinstance(value, dict) else {}
    return {}


def _cut(text: str | None, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters: cut after its last whole
    sentence that fits, else after a whole word, never inside one."""
    text = " ".join((text or "").split())
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    sentence = max(head.rfind(". "), head.rfind("! "), head.rfind("? "))
    if sentence >= limit // 2:
        return head[: sentence + 1]
    word = head.rfind(" ")
    return (head[:word] if word > 0 else head) + "…"


def _quote(text: str | None, limit: int = 500) -> str:
    """The error as the tool or the engine wrote it, as a Slack quote."""
    text = (text or "").strip()
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return "\n".join(f"> {line}" for line in text.splitlines() or [""])


def _search_summary(call: _Call) -> str:
    query = _echo(str(call.input.get("query", "")))
    if call.is_error:
        return f"The docs search for “{query}” failed:\n{_quote(call.result)}"
    found = _json(call.result)
    if not found:
        return f"The docs search for “{query}” returned: {_cut(call.result, 500)}"
    hits = found.get("results") or []
    if not hits:
        note = f" ({found['note']})" if found.get("note") else ""
        return f"Nothing in the docs matches “{query}”{note}."
    lines = [f"Found {len(hits)} match{'es' if len(hits) > 1 else ''} for “{query}” in the docs:"]
    for hit in hits:
        snippet = _cut(str(hit.get("snippet", "")).replace("#", ""), 140)
        lines.append(f"• *{hit.get('file')}:{hit.get('line')}* {snippet}")
    return "\n".join(lines)


def _deploy_summary(call: _Call) -> str:
    args = call.input
    what = _echo(" ".join(str(x) for x in (args.get("service"), args.get("version")) if x))
    env = _echo(str(args.get("environment", "staging")))
    if call.is_error:
        return f"Not deployed: {what} to {env}.\n{_quote(call.result)}"
    out = _json(call.result)
    if not {"deployment", "service", "version", "environment"} <= set(out):
        return f"Deployed {what} to {env}: {_cut(call.result, 300)}"
    return (
        f"Deployed {out['service']} {out['version']} to {out['environment']} "
        f"(deployment #{out['deployment']})."
    )


def _job_summary(call: _Call) -> str:
    name = _echo(str(call.input.get("name", "the job")))
    if call.is_error:
        return f"Job {name} did not finish:\n{_quote(call.result)}"
    out = _json(call.result)
    status = out.get("status", "finished")
    took = f" after {out['ran_for_s']} s" if "ran_for_s" in out else ""
    why = f": {out['error']}" if out.get("error") else ""
    return f"Job {_echo(str(out.get('job', name)))} {status}{took}{why}."


def _health_summary(call: _Call) -> str:
    service = _echo(str(call.input.get("service", "the service")))
    if call.is_error:
        return f"Could not check {service}:\n{_quote(call.result)}"
    out = _json(call.result)
    status = out.get("status", "unknown")
    attempt = out.get("attempt")
    retried = (
        f" (answered on attempt {attempt}; the engine retried the failed checks)"
        if isinstance(attempt, int) and attempt > 1
        else ""
    )
    if retried and call.input.get("simulate_crash"):
        retried = (
            f" (answered on attempt {attempt}: opsloop was killed during the first, and ran"
            " the check again once it was back)"
        )
    return f"{_echo(str(out.get('service', service)))} is {status}{retried}."


# --- the catalog (MCP) and the platform API (HTTP) --------------------------------------


def _structured(call: _Call) -> dict[str, Any]:
    """What an MCP tool answered: its structured content, else its text as JSON."""
    out = _json(call.result)
    found = out.get("structured")
    return found if isinstance(found, dict) else _json(str(out.get("text", "")))


def _list_summary(call: _Call) -> str:
    if call.is_error:
        return f"Could not read the catalog:\n{_quote(call.result)}"
    rows = _structured(call).get("services")
    if not isinstance(rows, list) or not rows:
        return f"The catalog answered: {_cut(call.result, 300)}"
    lines = [f"The catalog has {len(rows)} service{'' if len(rows) == 1 else 's'}:"]
    for row in rows:
        if isinstance(row, dict):
            lines.append(
                f"• *{_echo(str(row.get('service')))}*: owner {_echo(str(row.get('owner')))}, "
                f"{_replicas(row.get('replicas'))}"
            )
    return "\n".join(lines)


def _service_summary(call: _Call) -> str:
    service = _echo(str(call.input.get("service", "the service")))
    if call.is_error:
        return f"Could not look up {service}:\n{_quote(call.result)}"
    out = _structured(call)
    if "replicas" not in out:
        return f"{service}: {_cut(call.result, 300)}"
    return (
        f"*{service}*: owner {_echo(str(out.get('owner')))}, tier {_echo(str(out.get('tier')))}, "
        f"{_replicas(out['replicas'])}."
    )


def _replicas(n: Any) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


def _scale_summary(call: _Call) -> str:
    service = _echo(str(call.input.get("service", "the service")))
    replicas = call.input.get("replicas")
    if call.is_error and _DID_NOT_HAPPEN in (call.result or ""):
        # A person's word on an interrupted call, not the catalog's: say whose it is,
        # and where to look (the demo's catalog saves the change before it crashes).
        return (
            f"I did not run it again: scaling {service} to {_replicas(replicas)} did not "
            f"happen, a person said.\n{_quote(call.result)}\n"
            f"`show service {service}` shows what the catalog has now."
        )
    if call.is_error:
        return f"Not scaled: {service} to {_replicas(replicas)}.\n{_quote(call.result)}"
    out = _structured(call)
    if "was" in out and out["was"] == out.get("replicas") and call.input.get("simulate_crash"):
        # Run again after the crash: the first attempt had made the change already.
        return (
            f"{service} has {_replicas(out['was'])}: the interrupted call had taken effect"
            " before the crash, so running it again changed nothing."
        )
    if "was" in out and out["was"] == out.get("replicas"):
        return f"{service} already had {_replicas(out['was'])}; nothing changed."
    if "was" in out:
        return f"Scaled {service} to {_replicas(out.get('replicas'))} (it had {out['was']})."
    # Not the tool's answer: a person said what became of a call cut off mid-way.
    return f"Scaled {service} to {_replicas(replicas)}: {_cut(call.result, 300)}"


def _restart_summary(call: _Call) -> str:
    service = _echo(str(call.input.get("service", "the service")))
    if call.is_error:
        return f"Not restarted: {service}.\n{_quote(call.result)}"
    body = _json(call.result).get("body")  # an HTTP action answers {"status", "body"}
    out = body if isinstance(body, dict) else {}
    if "restart" not in out:
        return f"Restarted {service}: {_cut(call.result, 300)}"
    again = " (the platform had already done it for this call)" if out.get("repeat") else ""
    return f"Restarted {service} through the platform API (restart #{out['restart']}){again}."


def _look_into(m: re.Match[str], calls: tuple[_Call, ...], tools: set[str | None]) -> _Step:
    """The next of three read-only calls about one service, then what they found."""
    service = m["s"].lower()
    health: dict[str, Any] = {"service": service}
    checking = "Now its health check."
    if m["crash"]:
        health["simulate_crash"] = True
        checking += " opsloop will be killed during it: start it again and this plan carries on."
    steps: list[tuple[str, dict[str, Any], str]] = [
        (GET_SERVICE, {"service": service}, f"Looking into {_echo(service)}: the catalog first."),
        ("check_health", health, checking),
        (ONCALL, {}, "And who is on call."),
    ]
    if calls and calls[-1].result is None:
        return _Step(f"Still waiting for `{calls[-1].name}` to finish.")
    if len(calls) < len(steps):
        return _use(tools, *steps[len(calls)])
    found = [_health_summary(c) if c.name == "check_health" else _summary(c) for c in calls]
    return _Step("\n".join([f"What I found about {_echo(service)}:", *found]))


def _summary(call: _Call) -> str:
    summarise = SUMMARIES.get(call.name)
    if summarise is not None:
        return summarise(call)
    return f"`{call.name}` returned: {_cut(call.result, 300)}"


# --- GitHub Actions and PagerDuty (local mode's own opsloop.yaml) ------------------------


def _ci_step(req: _DeployRequest, tools: set[str | None]) -> _Step:
    if req.unknown_environment:
        return _Step(
            f"I can deploy to staging or production, not “{_echo(req.unknown_environment)}”. "
            "Try `deploy api to staging through CI`."
        )
    if req.service is None:
        return _Step("Which service? Try `deploy api to staging through CI`.")
    env = req.environment or "staging"
    inputs = {"service": req.service, "environment": env}
    if req.version:
        inputs["version"] = req.version
    args = {"repo": CI_REPO, "workflow": CI_WORKFLOW, "ref": CI_REF, "inputs": inputs}
    what = _echo(f"{req.service} {req.version}" if req.version else req.service)
    text = (
        f"Deploying {what} to {env} through CI ({CI_WORKFLOW} on {CI_REPO}), once it is "
        "approved; I'll report how the run ends."
    )
    return _use(tools, DISPATCH, args, text)


def _seconds(value: Any) -> str:
    return f"{round(value)} s" if isinstance(value, int | float) else "an unknown time"


def _ci_summary(call: _Call) -> str:
    given = call.input.get("inputs")
    inputs: dict[str, Any] = given if isinstance(given, dict) else {}
    what = _echo(" ".join(str(x) for x in (inputs.get("service"), inputs.get("version")) if x))
    env = _echo(str(inputs.get("environment", "staging")))
    if call.is_error:
        return f"Not deployed through CI: {what} to {env}.\n{_quote(call.result)}"
    out = _json(call.result)
    if "conclusion" not in out:
        return f"The CI run of {what} to {env} ended: {_cut(call.result, 300)}"
    run = f"the {_echo(str(out.get('workflow') or CI_WORKFLOW))} run {out.get('run_id')}"
    link = f" {out['html_url']}" if isinstance(out.get("html_url"), str) else ""
    if out["conclusion"] == "success":
        took = _seconds(out.get("duration_s"))
        return f"Deployed {what} to {env} through CI: {run} succeeded in {took}.{link}"
    if out.get("error"):
        return f"Not known whether {what} is deployed to {env}: {run}: {_echo(str(out['error']))}"
    failed = [str(j) for j in out.get("failed_jobs") or []]
    jobs = f" Failed jobs: {_echo(', '.join(failed))}." if failed else ""
    return (
        f"Not deployed: {run} of {what} to {env} ended {_echo(str(out['conclusion']))} "
        f"after {_seconds(out.get('duration_s'))}.{jobs}{link}"
    )


def _oncall_summary(call: _Call) -> str:
    if call.is_error:
        return f"PagerDuty could not say who is on call:\n{_quote(call.result)}"
    rows = _json(call.result).get("oncalls")
    if not isinstance(rows, list):
        return f"PagerDuty answered: {_cut(call.result, 300)}"
    if not rows:
        return "Nobody is on call in PagerDuty right now."
    lines = ["On call now, says PagerDuty:"]
    for row in rows[:10]:
        if not isinstance(row, dict):
            continue
        where = row.get("schedule") or row.get("escalation_policy") or {}
        name = where.get("name") or where.get("id") if isinstance(where, dict) else None
        until = f", until {_echo(str(row['until']))}" if row.get("until") else ""
        lines.append(
            f"• *{_echo(str(row.get('user')))}* ({_echo(str(row.get('email')))}): "
            f"{_echo(str(name or 'on call'))}, level {row.get('level')}{until}"
        )
    return "\n".join(lines)


# --- an alert's thread ------------------------------------------------------------------


@dataclass(frozen=True)
class _Alert:
    status: str
    summary: str
    service: str | None


def _alert(request: str) -> _Alert | None:
    """The alert an alert's input carries (its data, after the heading), or None."""
    if not _ALERT.match(request):
        return None
    start = request.find("{")
    try:
        data, _ = json.JSONDecoder().raw_decode(request, start) if start >= 0 else ({}, 0)
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    labels = data.get("labels")
    service = labels.get("service") if isinstance(labels, dict) else None
    return _Alert(
        str(data.get("status") or "firing"),
        str(data.get("summary") or "an alert"),
        str(service).lower() if isinstance(service, str) and re.fullmatch(_NAME, service) else None,
    )


def _alert_step(alert: _Alert, tools: set[str | None]) -> _Step:
    summary = _echo(alert.summary)
    if alert.status == "resolved":
        return _Step(f"The alert has resolved (“{summary}”). Nothing more to look at here.")
    if alert.service is None:
        return _Step(
            f"An alert fired: “{summary}”. It names no service, and I know no read-only "
            "check for it, so I did nothing."
        )
    text = f"An alert fired: “{summary}”. Checking the health of {alert.service} (read-only)."
    return _use(tools, "check_health", {"service": alert.service}, text)


def _after_alert(alert: _Alert, health: str) -> str:
    return f"{health}\nThe alert: “{_echo(alert.summary)}”. I only looked: nothing was changed."


SUMMARIES = {
    LIST_SERVICES: _list_summary,
    GET_SERVICE: _service_summary,
    SCALE_SERVICE: _scale_summary,
    RESTART_SERVICE: _restart_summary,
    DISPATCH: _ci_summary,
    ONCALL: _oncall_summary,
}
