"""The process's Prometheus metrics: one registry, the metric objects, and the scrape.

Everything is named ``opsloop_…`` and lives in :data:`REGISTRY` (not the client's
global one, which libraries may fill). Labels are bounded sets: a step's action, a
model id, a tool name, a Slack method, an error kind; never a thread, user or event
id. Counters and histograms are per process (sum them across replicas); the gauges of
:func:`scrape` are read from the database at scrape time, so every replica reports the
same totals (take their max, not their sum).

Who observes what: the runner (steps, model calls and tokens, tool calls, wake lag),
the Anthropic adapter (model errors by kind), the Slack client's counting handler
(``bot.slack_metrics``), the health app (ack latency), the lease code (takeovers), the
inputs of Slack's agent surface (feedback, stops: ``engine.agent_inputs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Self

import prometheus_client
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Children(MetricWrapperBase):
    """``labels()`` answered from a dict: the client validates and locks each time (about
    8 µs), and the runner asks five times a step. Children are never removed here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cache: dict[tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]], Self] = {}

    def labels(self, *values: Any, **named: Any) -> Self:
        key = (values, tuple(named.items()))
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = super().labels(*values, **named)
        return child


class Counter(_Children, prometheus_client.Counter):
    pass


class Histogram(_Children, prometheus_client.Histogram):
    pass


disable_created_metrics()  # no *_created series: a third of the lines, never used here
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

# Seconds; a model call or a tool may take minutes, an ack must take well under 3 s.
_SLOW = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0)
_LAG = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)

STEPS = Counter(
    "opsloop_steps",
    "Runner steps, by what the step did (ask_model, execute_tool, expire_approval, …).",
    ["action"],
    registry=REGISTRY,
)
MODEL_CALLS = Counter(
    "opsloop_model_calls",
    "Model calls, by model and outcome (ok | error).",
    ["model", "outcome"],
    registry=REGISTRY,
)
MODEL_SECONDS = Histogram(
    "opsloop_model_call_seconds",
    "Latency of one model call, failed ones included.",
    ["model"],
    buckets=_SLOW,
    registry=REGISTRY,
)
MODEL_TOKENS = Counter(
    "opsloop_model_tokens",
    "Tokens of the model calls, by kind (input | output | cache_read | cache_write).",
    ["model", "kind"],
    registry=REGISTRY,
)
MODEL_ERRORS = Counter(
    "opsloop_model_errors",
    "Failed Anthropic API calls, by kind (rate_limited, overloaded, server, timeout, "
    "connection, auth, permission, not_found, conflict, too_large, bad_request, spend_limit, "
    "invalid_reply, other).",
    ["kind"],
    registry=REGISTRY,
)
TOOL_CALLS = Counter(
    "opsloop_tool_calls",
    "Tool call attempts, by tool and outcome (ok | error | retry | unknown | wait).",
    ["tool", "outcome"],
    registry=REGISTRY,
)
TOOL_SECONDS = Histogram(
    "opsloop_tool_call_seconds",
    "Latency of one tool call attempt.",
    ["tool"],
    buckets=_SLOW,
    registry=REGISTRY,
)
WAKE_LAG = Histogram(
    "opsloop_wake_lag_seconds",
    "From the time a thread was due (a retry, a timer, an approval's expiry) to its run start.",
    buckets=_LAG,
    registry=REGISTRY,
)
LEASE_TAKEOVERS = Counter(
    "opsloop_lease_takeovers",
    "Leases taken from another owner, by reason (expired | dead_owner).",
    ["reason"],
    registry=REGISTRY,
)
SLACK_CALLS = Counter(
    "opsloop_slack_api_calls",
    "Slack Web API requests (each HTTP attempt), by method.",
    ["method"],
    registry=REGISTRY,
)
SLACK_ERRORS = Counter(
    "opsloop_slack_api_errors",
    "Slack Web API requests that failed, by method and error (Slack's error code, "
    "http_<status>, connection).",
    ["method", "error"],
    registry=REGISTRY,
)
SLACK_RATELIMITED = Counter(
    "opsloop_slack_api_ratelimited",
    "Slack Web API requests answered 429, by method.",
    ["method"],
    registry=REGISTRY,
)
SLACK_ACK_SECONDS = Histogram(
    "opsloop_slack_ack_seconds",
    "From a Slack request's arrival to our answer (Slack wants it within 3 s).",
    buckets=_FAST,
    registry=REGISTRY,
)

FEEDBACK = Counter(
    "opsloop_feedback",
    "Feedback clicks under answers (feedback_given), by value (up | down).",
    ["value"],
    registry=REGISTRY,
)
STOPS = Counter(
    "opsloop_stops",
    "Runs people stopped with Slack's stop button (stop_requested).",
    registry=REGISTRY,
)

for _reason in ("expired", "dead_owner"):  # both series exist from the start, at 0
    LEASE_TAKEOVERS.labels(reason=_reason)
for _value in ("up", "down"):
    FEEDBACK.labels(value=_value)


def count_inputs(events: Iterable[Any]) -> None:
    """Count the people's inputs that have counters (feedback, stops), as they are
    stored; a redelivered one, found stored, is not passed here again."""
    for e in events:
        kind = getattr(e, "type", None)
        if kind == "feedback_given":
            FEEDBACK.labels(value=e.value).inc()
        elif kind == "stop_requested":
            STOPS.inc()


class _Families(Collector):
    """Metric families computed just before a scrape (from the database)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def store_families(
    counts: Mapping[str, int],
    oldest_approval: datetime | None,
    now: datetime,
    statuses: Iterable[str] = (),
) -> list[Metric]:
    """Threads by status, approvals pending and the oldest one's age, from what
    ``Store.status_counts`` read. ``statuses``: shown at 0 when no thread has them."""
    threads = GaugeMetricFamily(
        "opsloop_threads", "Threads by status (read from the database).", labels=["status"]
    )
    for status in sorted({*statuses, *counts}):
        threads.add_metric([status], counts.get(status, 0))
    pending = GaugeMetricFamily(
        "opsloop_approvals_pending", "Threads awaiting an approval (read from the database)."
    )
    pending.add_metric([], counts.get("awaiting_approval", 0))
    age = GaugeMetricFamily(
        "opsloop_approval_oldest_age_seconds",
        "Age of the oldest pending approval request; 0 when none is pending.",
    )
    age.add_metric([], max(0.0, (now - oldest_approval).total_seconds()) if oldest_approval else 0)
    return [threads, pending, age]


def mcp_families(servers: Iterable[tuple[str, bool, int, int]]) -> list[Metric]:
    """The serving process's MCP servers, each ``(server, up, tools offered, tools
    redefined while it ran)``, as this process holds them at the scrape."""
    up = GaugeMetricFamily(
        "opsloop_mcp_server_up",
        "1 when the last exchange with the MCP server worked; 0 while it is down (its "
        "tools are not offered, and it is retried in the background).",
        labels=["server"],
    )
    tools = GaugeMetricFamily(
        "opsloop_mcp_tools", "Tools of the MCP server offered to the model.", labels=["server"]
    )
    redefined = GaugeMetricFamily(
        "opsloop_mcp_tools_redefined",
        "Tools of the MCP server whose definition changed since this process first offered "
        "them (calls requested under the old one were refused).",
        labels=["server"],
    )
    for server, is_up, offered, changed in servers:
        up.add_metric([server], 1 if is_up else 0)
        tools.add_metric([server], offered)
        redefined.add_metric([server], changed)
    return [up, tools, redefined]


def scrape(families: Iterable[Metric] = ()) -> bytes:
    """The Prometheus text exposition of this process's metrics plus ``families``."""
    extra = CollectorRegistry(auto_describe=False)
    extra.register(_Families(families))
    return generate_latest(REGISTRY) + generate_latest(extra)
