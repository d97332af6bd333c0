"""Alerts from monitoring systems: what each sends, parsed into :class:`Alert` values.

Three shapes, one parser each, each turning a decoded JSON body into the alerts it
carries or raising :class:`AlertProblem` (one line; the route answers 400 and stores
nothing, so every alert of a body is checked before any is stored):

* Alertmanager's webhook (``version`` "4"): every entry of ``alerts`` is one alert,
  identified by its ``fingerprint``
  (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config);
* PagerDuty's v3 webhooks: ``incident.triggered`` / ``incident.reopened`` fire and
  ``incident.resolved`` resolves the incident ``event.data.id``; every other event type
  is none of ours (no alert, nothing stored)
  (https://developer.pagerduty.com/docs/webhooks-overview);
* the generic shape (README, "Alerts"): one JSON object, ``fingerprint``, ``status``
  (firing | resolved), ``summary``, and optionally ``labels``, ``annotations``, ``url``
  and ``id`` (the delivery's id: a repeat of it is stored once).

Each alert carries the id that makes a resent notification the same input
(``Alert.delivery``, the event's dedupe key): Alertmanager repeats a firing alert every
``repeat_interval`` with the same ``startsAt``, and PagerDuty retries a delivery with the
same event id. Values people see are cut to a size a Slack message and a prompt carry;
a body of the wrong shape (a label that is not a string, too many alerts) is refused.

Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from engine import events as ev

SourceName = Literal["alertmanager", "pagerduty", "generic"]
SOURCES: tuple[SourceName, ...] = ("alertmanager", "pagerduty", "generic")
Status = Literal["firing", "resolved"]

MAX_ALERTS = 100  # per request (Alertmanager's max_alerts keeps a group under it)
MAX_FINGERPRINT = 200
MAX_SUMMARY = 2000
MAX_LABELS = 64  # entries of labels, and of annotations
MAX_KEY = 128
MAX_VALUE = 2000
MAX_URL = 2000

# Where a thread opened by an alert lives until its root is posted (``Store.set_root``
# moves it to the post's ts): a Slack ts never starts like this.
PENDING_ROOT = "pending:"
# PagerDuty's incident events that fire or resolve; the others (acknowledged, annotated,
# escalated, priority updated…) change nothing here.
PAGERDUTY_STATUS: dict[str, Status] = {
    "incident.triggered": "firing",
    "incident.reopened": "firing",
    "incident.resolved": "resolved",
}
GENERIC_KEYS = frozenset({"fingerprint", "status", "summary", "labels", "annotations", "url", "id"})
_URL = re.compile(r"https?://[^\s<>|]+", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class AlertProblem(ValueError):
    """A body that is not what its source sends (one line, naming the field)."""


@dataclass(frozen=True)
class Alert:
    """One alert as a route parsed it: which (``source``, ``fingerprint``), whether it
    fires or resolved, what people and the model read, and ``delivery``, the id of this
    notification (the same on a resend)."""

    source: SourceName
    fingerprint: str
    status: Status
    summary: str
    delivery: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    url: str = ""

    def event(self, *, channel: str, instruction: str) -> ev.AlertReceived:
        """The ``alert_received`` input for ``channel``, told ``instruction``."""
        digest = hashlib.sha256(self.delivery.encode()).hexdigest()[:40]
        return ev.AlertReceived(
            actor=f"alert:{self.source}",
            source=self.source,
            fingerprint=self.fingerprint,
            status=self.status,
            summary=self.summary,
            labels=self.labels,
            annotations=self.annotations,
            url=self.url,
            instruction=instruction,
            channel=channel,
            # Hashed: a fingerprint and a timestamp may outgrow the column.
            dedupe_key=f"alert:{self.source}:{digest}",
        )


def pending_root() -> str:
    """A new placeholder root (unique: the thread key must be)."""
    return PENDING_ROOT + secrets.token_hex(10)


def is_pending_root(root_ts: str) -> bool:
    return root_ts.startswith(PENDING_ROOT)


def parse(source: SourceName, body: Any, *, delivery: str = "") -> list[Alert]:
    """The alerts ``body`` carries for ``source``; ``delivery``: the request's own id
    (the generic route's signature), used when the body names none."""
    if source == "alertmanager":
        return parse_alertmanager(body)
    if source == "pagerduty":
        return parse_pagerduty(body)
    return parse_generic(body, delivery=delivery)


# --- Alertmanager ---------------------------------------------------------------------


def parse_alertmanager(body: Any) -> list[Alert]:
    """Alertmanager's webhook payload (version 4): one alert per entry of ``alerts``."""
    data = _object(body, "the body")
    if data.get("version") != "4":
        raise AlertProblem("version: this route reads Alertmanager's webhook version 4")
    entries = data.get("alerts")
    if not isinstance(entries, list):
        raise AlertProblem("alerts: must be a list")
    if len(entries) > MAX_ALERTS:
        raise AlertProblem(f"alerts: {len(entries)} alerts, at most {MAX_ALERTS} per request")
    return [_alertmanager_alert(entry, f"alerts[{i}]") for i, entry in enumerate(entries)]


def _alertmanager_alert(entry: Any, where: str) -> Alert:
    alert = _object(entry, where)
    status = _status(alert.get("status"), f"{where}.status")
    fingerprint = _fingerprint(alert.get("fingerprint"), f"{where}.fingerprint")
    labels = _strings(alert.get("labels"), f"{where}.labels")
    annotations = _strings(alert.get("annotations"), f"{where}.annotations")
    starts = _text(alert.get("startsAt"), f"{where}.startsAt", 64)
    summary = (
        annotations.get("summary")
        or annotations.get("description")
        or labels.get("alertname")
        or fingerprint
    )
    return Alert(
        source="alertmanager",
        fingerprint=fingerprint,
        status=status,
        summary=_cut(summary, MAX_SUMMARY),
        # A repeat (repeat_interval, a retried delivery) has the same startsAt; a new
        # firing after a resolution has a new one.
        delivery=f"{fingerprint}|{status}|{starts}",
        labels=labels,
        annotations=annotations,
        url=_link(alert.get("generatorURL")),
    )


# --- PagerDuty ------------------------------------------------------------------------


def parse_pagerduty(body: Any) -> list[Alert]:
    """A PagerDuty v3 webhook: the incident it fires or resolves, or nothing (another
    event type, such as ``incident.acknowledged`` or the ``pagey.ping`` test)."""
    data = _object(body, "the body")
    event = _object(data.get("event"), "event")
    kind = _text(event.get("event_type"), "event.event_type", 200)
    event_id = _text(event.get("id"), "event.id", 200)
    if not kind:
        raise AlertProblem("event.event_type: is required")
    status = PAGERDUTY_STATUS.get(kind)
    if status is None:
        return []
    if not event_id:
        raise AlertProblem("event.id: is required")
    incident = _object(event.get("data"), "event.data")
    fingerprint = _fingerprint(incident.get("id"), "event.data.id")
    title = _text(incident.get("title"), "event.data.title", MAX_SUMMARY)
    labels: dict[str, str] = {}
    service = incident.get("service")
    if isinstance(service, dict) and isinstance(service.get("summary"), str):
        labels["service"] = _cut(service["summary"], MAX_VALUE)
    if isinstance(incident.get("urgency"), str):
        labels["urgency"] = _cut(incident["urgency"], MAX_VALUE)
    priority = incident.get("priority")
    if isinstance(priority, dict) and isinstance(priority.get("summary"), str):
        labels["priority"] = _cut(priority["summary"], MAX_VALUE)
    if isinstance(incident.get("number"), int) and not isinstance(incident["number"], bool):
        labels["incident_number"] = str(incident["number"])
    return [
        Alert(
            source="pagerduty",
            fingerprint=fingerprint,
            status=status,
            summary=title or f"PagerDuty incident {fingerprint}",
            delivery=event_id,  # PagerDuty retries a delivery with the same event id
            labels=labels,
            url=_link(incident.get("html_url")),
        )
    ]


# --- generic --------------------------------------------------------------------------


def parse_generic(body: Any, *, delivery: str = "") -> list[Alert]:
    """The generic shape: one alert per request (README, "Alerts")."""
    data = _object(body, "the body")
    # Named in the answer and the log: cut, and no control characters (a key is the sender's).
    unknown = sorted(_CONTROL.sub("?", str(k))[:100] for k in data if k not in GENERIC_KEYS)
    if unknown:
        expected = ", ".join(sorted(GENERIC_KEYS))
        raise AlertProblem(f"{unknown[0]}: unknown key (expected {expected})")
    fingerprint = _fingerprint(data.get("fingerprint"), "fingerprint")
    status = _status(data.get("status"), "status")
    summary = _text(data.get("summary"), "summary", MAX_SUMMARY)
    if not summary.strip():
        raise AlertProblem("summary: is required")
    url = _text(data.get("url"), "url", MAX_URL + 1)
    if url and (len(url) > MAX_URL or not _URL.fullmatch(url)):
        raise AlertProblem(f"url: must be an http(s) URL of at most {MAX_URL} characters")
    given = _text(data.get("id"), "id", 200)
    return [
        Alert(
            source="generic",
            fingerprint=fingerprint,
            status=status,
            summary=summary,
            delivery=f"id:{given}" if given else f"request:{delivery}",
            labels=_strings(data.get("labels"), "labels"),
            annotations=_strings(data.get("annotations"), "annotations"),
            url=url,
        )
    ]


# --- checks ---------------------------------------------------------------------------


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise AlertProblem(f"{where}: must be a JSON object")
    return value


def _status(value: Any, where: str) -> Status:
    if value == "firing":
        return "firing"
    if value == "resolved":
        return "resolved"
    raise AlertProblem(f"{where}: must be 'firing' or 'resolved'")


def _text(value: Any, where: str, limit: int) -> str:
    """An optional string, cut to ``limit``."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AlertProblem(f"{where}: must be a string")
    return _cut(value, limit)


def _fingerprint(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise AlertProblem(f"{where}: must be a non-empty string")
    if len(value) > MAX_FINGERPRINT:
        raise AlertProblem(f"{where}: at most {MAX_FINGERPRINT} characters")
    if _CONTROL.search(value):
        raise AlertProblem(f"{where}: must not hold control characters")
    return value


def _strings(value: Any, where: str) -> dict[str, str]:
    """A map of strings (labels, annotations): keys checked, values cut."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AlertProblem(f"{where}: must be an object of strings")
    if len(value) > MAX_LABELS:
        raise AlertProblem(f"{where}: {len(value)} entries, at most {MAX_LABELS}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or len(key) > MAX_KEY:
            raise AlertProblem(f"{where}: keys are strings of 1 to {MAX_KEY} characters")
        if not isinstance(item, str):
            raise AlertProblem(f"{where}.{key}: must be a string")
        out[key] = _cut(item, MAX_VALUE)
    return out


def _link(value: Any) -> str:
    """A link a monitoring system sent: kept if it is an http(s) URL, else dropped (the
    alert is worth more than its link)."""
    if isinstance(value, str) and len(value) <= MAX_URL and _URL.fullmatch(value):
        return value
    return ""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
