"""Alerts, pure: what Alertmanager, PagerDuty and the generic shape send, parsed into
alerts (or refused with one line); how an alert opens, continues and resolves a thread's
state; how the model and a compaction read it."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from engine import events as ev
from engine.alerts import (
    MAX_ALERTS,
    MAX_SUMMARY,
    AlertProblem,
    is_pending_root,
    parse,
    parse_alertmanager,
    parse_generic,
    parse_pagerduty,
    pending_root,
)
from engine.compaction import Digest
from engine.context import alert_text, project
from engine.errors import IllegalTransition
from engine.state import ThreadState, apply, next_action, reduce
from tests.support.logs import T0, alert, answered, stamp, user

# What Alertmanager 0.27 posts to a webhook receiver (send_resolved: true), one group
# of two alerts (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config).
ALERTMANAGER: dict[str, Any] = {
    "receiver": "opsloop",
    "status": "firing",
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "HighLatency",
                "instance": "api-1:9100",
                "service": "api",
                "severity": "page",
            },
            "annotations": {
                "summary": "p99 latency above 2s on api",
                "description": "p99 has been 2.4s for 10 minutes.",
                "runbook_url": "https://runbooks.example/latency",
            },
            "startsAt": "2025-01-06T09:00:00.000Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph?g0.expr=latency%3E2&g0.tab=1",
            "fingerprint": "5b9b5a2e3c1f0a7d",
        },
        {
            "status": "resolved",
            "labels": {"alertname": "DiskFull", "instance": "db-1:9100"},
            "annotations": {},
            "startsAt": "2025-01-06T08:00:00.000Z",
            "endsAt": "2025-01-06T09:05:00.000Z",
            "generatorURL": "http://prometheus:9090/graph?g0.expr=disk",
            "fingerprint": "0c2e8f6d5a4b3c21",
        },
    ],
    "groupLabels": {"alertname": "HighLatency"},
    "commonLabels": {"service": "api"},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "version": "4",
    "groupKey": '{}:{alertname="HighLatency"}',
    "truncatedAlerts": 0,
}

# A PagerDuty v3 webhook (https://developer.pagerduty.com/docs/webhooks-overview).
PAGERDUTY: dict[str, Any] = {
    "event": {
        "id": "01DEN4HPBQAAAG05V5QQYBRZMF",
        "event_type": "incident.triggered",
        "resource_type": "incident",
        "occurred_at": "2025-01-06T09:01:02.123Z",
        "agent": {
            "html_url": "https://acme.pagerduty.com/users/PLH1HKV",
            "id": "PLH1HKV",
            "self": "https://api.pagerduty.com/users/PLH1HKV",
            "summary": "Tenex Engineer",
            "type": "user_reference",
        },
        "client": None,
        "data": {
            "id": "PGR0VU2",
            "type": "incident",
            "self": "https://api.pagerduty.com/incidents/PGR0VU2",
            "html_url": "https://acme.pagerduty.com/incidents/PGR0VU2",
            "number": 2,
            "status": "triggered",
            "incident_key": "d3640fbd41094207a1c11e58e46b1662",
            "created_at": "2025-01-06T09:01:02Z",
            "title": "Checkout error rate above 5%",
            "service": {
                "html_url": "https://acme.pagerduty.com/services/PF9KMXH",
                "id": "PF9KMXH",
                "self": "https://api.pagerduty.com/services/PF9KMXH",
                "summary": "Checkout API",
                "type": "service_reference",
            },
            "assignees": [],
            "escalation_policy": {"id": "PJ9YYP8", "type": "escalation_policy_reference"},
            "teams": [],
            "priority": {"id": "PSO75BM", "summary": "P1", "type": "priority_reference"},
            "urgency": "high",
            "conference_bridge": None,
            "resolve_reason": None,
        },
    }
}


def pagerduty(kind: str, event_id: str = "01DEN4HPBQAAAG05V5QQYBRZMF") -> dict[str, Any]:
    body = copy.deepcopy(PAGERDUTY)
    body["event"]["event_type"] = kind
    body["event"]["id"] = event_id
    return body


# --- Alertmanager ---------------------------------------------------------------------


def test_alertmanager_gives_one_alert_per_entry_with_its_fingerprint() -> None:
    firing, resolved = parse_alertmanager(json.loads(json.dumps(ALERTMANAGER)))
    assert (firing.source, firing.fingerprint, firing.status) == (
        "alertmanager",
        "5b9b5a2e3c1f0a7d",
        "firing",
    )
    assert firing.summary == "p99 latency above 2s on api"
    assert firing.labels["severity"] == "page"
    assert firing.annotations["runbook_url"] == "https://runbooks.example/latency"
    assert firing.url.startswith("http://prometheus:9090/graph")
    # Without a summary annotation: the alert's name says what it is.
    assert (resolved.status, resolved.summary) == ("resolved", "DiskFull")


def test_an_alertmanager_repeat_is_the_same_delivery_and_a_new_firing_is_not() -> None:
    again = copy.deepcopy(ALERTMANAGER)
    again["alerts"][0]["annotations"]["description"] = "p99 is 2.6s now"  # repeat_interval
    later = copy.deepcopy(ALERTMANAGER)
    later["alerts"][0]["startsAt"] = "2025-01-06T11:00:00.000Z"  # resolved, fired again
    first = parse_alertmanager(ALERTMANAGER)[0]
    assert parse_alertmanager(again)[0].delivery == first.delivery
    assert parse_alertmanager(later)[0].delivery != first.delivery
    event = first.event(channel="C1", instruction="look")
    assert (
        event.dedupe_key
        == parse_alertmanager(again)[0].event(channel="C1", instruction="look").dedupe_key
    )
    assert event.dedupe_key is not None and len(event.dedupe_key) <= 255


@pytest.mark.parametrize(
    ("change", "names"),
    [
        (lambda b: b.update(version="3"), "version"),
        (lambda b: b.update(alerts={"a": 1}), "alerts"),
        (lambda b: b["alerts"][0].update(status="pending"), "alerts[0].status"),
        (lambda b: b["alerts"][1].update(fingerprint=""), "alerts[1].fingerprint"),
        (lambda b: b["alerts"][0].update(fingerprint=7), "alerts[0].fingerprint"),
        (lambda b: b["alerts"][0]["labels"].update(severity=3), "alerts[0].labels.severity"),
        (lambda b: b["alerts"][0].update(annotations=["x"]), "alerts[0].annotations"),
        (lambda b: b["alerts"][0].update(startsAt={"t": 1}), "alerts[0].startsAt"),
        (lambda b: b["alerts"].__setitem__(0, "alert"), "alerts[0]"),
        (lambda b: b["alerts"][0].update(fingerprint="a\nb"), "alerts[0].fingerprint"),
    ],
)
def test_an_alertmanager_body_of_the_wrong_shape_is_refused_naming_the_field(
    change: Any, names: str
) -> None:
    body = copy.deepcopy(ALERTMANAGER)
    change(body)
    with pytest.raises(AlertProblem, match="^" + re.escape(names) + ":"):
        parse_alertmanager(body)


def test_too_many_alerts_or_labels_are_refused_and_long_texts_are_cut() -> None:
    many = copy.deepcopy(ALERTMANAGER)
    many["alerts"] = [ALERTMANAGER["alerts"][0]] * (MAX_ALERTS + 1)
    with pytest.raises(AlertProblem, match="at most 100"):
        parse_alertmanager(many)
    labels = copy.deepcopy(ALERTMANAGER)
    labels["alerts"][0]["labels"] = {f"k{i}": "v" for i in range(65)}
    with pytest.raises(AlertProblem, match="labels: 65 entries"):
        parse_alertmanager(labels)
    long = copy.deepcopy(ALERTMANAGER)
    long["alerts"][0]["annotations"]["summary"] = "x" * 100_000
    (cut, _) = parse_alertmanager(long)
    assert len(cut.summary) == MAX_SUMMARY and cut.summary.endswith("…")


def test_a_link_that_is_not_http_is_dropped_not_refused() -> None:
    body = copy.deepcopy(ALERTMANAGER)
    body["alerts"][0]["generatorURL"] = "javascript:alert(1)"
    assert parse_alertmanager(body)[0].url == ""


@pytest.mark.parametrize("body", [None, [], "x", 4, {"version": "4"}])
def test_what_is_not_an_alertmanager_body_is_refused(body: Any) -> None:
    with pytest.raises(AlertProblem):
        parse_alertmanager(body)


# --- PagerDuty ------------------------------------------------------------------------


def test_a_triggered_incident_fires_and_a_resolved_one_resolves() -> None:
    [fired] = parse_pagerduty(PAGERDUTY)
    assert (fired.source, fired.fingerprint, fired.status) == ("pagerduty", "PGR0VU2", "firing")
    assert fired.summary == "Checkout error rate above 5%"
    assert fired.url == "https://acme.pagerduty.com/incidents/PGR0VU2"
    assert fired.labels == {
        "service": "Checkout API",
        "urgency": "high",
        "priority": "P1",
        "incident_number": "2",
    }
    [resolved] = parse_pagerduty(pagerduty("incident.resolved", "01DEN5XXXX"))
    assert (resolved.fingerprint, resolved.status) == ("PGR0VU2", "resolved")
    assert resolved.delivery != fired.delivery  # each PagerDuty event is its own delivery
    [reopened] = parse_pagerduty(pagerduty("incident.reopened", "01DEN6XXXX"))
    assert reopened.status == "firing"


@pytest.mark.parametrize(
    "kind", ["incident.acknowledged", "incident.annotated", "incident.escalated", "pagey.ping"]
)
def test_other_pagerduty_events_carry_no_alert(kind: str) -> None:
    assert parse_pagerduty(pagerduty(kind)) == []


@pytest.mark.parametrize(
    ("change", "names"),
    [
        (lambda b: b.pop("event"), "event"),
        (lambda b: b["event"].update(event_type=None), "event.event_type"),
        (lambda b: b["event"].update(id=None), "event.id"),
        (lambda b: b["event"].update(data=[]), "event.data"),
        (lambda b: b["event"]["data"].update(id=12), "event.data.id"),
        (lambda b: b["event"]["data"].update(title=["x"]), "event.data.title"),
    ],
)
def test_a_pagerduty_body_of_the_wrong_shape_is_refused(change: Any, names: str) -> None:
    body = copy.deepcopy(PAGERDUTY)
    change(body)
    with pytest.raises(AlertProblem, match=rf"^{names}:"):
        parse_pagerduty(body)


# --- generic --------------------------------------------------------------------------


def test_the_generic_shape_is_one_alert_and_its_id_is_the_delivery() -> None:
    body = {
        "fingerprint": "disk-full/db-1",
        "status": "firing",
        "summary": "Disk 95% full on db-1",
        "labels": {"host": "db-1", "severity": "warning"},
        "url": "https://grafana.example/d/disk",
        "id": "n-123",
    }
    [one] = parse_generic(body, delivery="v1=abc")
    assert (one.source, one.fingerprint, one.status, one.url) == (
        "generic",
        "disk-full/db-1",
        "firing",
        "https://grafana.example/d/disk",
    )
    assert one.delivery == "id:n-123"
    body.pop("id")
    assert parse_generic(body, delivery="v1=abc")[0].delivery == "request:v1=abc"
    assert parse("generic", body, delivery="v1=x")[0].delivery == "request:v1=x"


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"status": "firing", "summary": "s"}, "fingerprint"),
        ({"fingerprint": "f", "status": "up", "summary": "s"}, "status"),
        ({"fingerprint": "f", "status": "firing"}, "summary"),
        ({"fingerprint": "f", "status": "firing", "summary": "  "}, "summary"),
        ({"fingerprint": "f", "status": "firing", "summary": "s", "url": "ftp://x"}, "url"),
        ({"fingerprint": "f", "status": "firing", "summary": "s", "labels": {"a": 1}}, "labels.a"),
        ({"fingerprint": "f", "status": "firing", "summary": "s", "sumary": "t"}, "sumary"),
        ({"fingerprint": "f" * 201, "status": "firing", "summary": "s"}, "fingerprint"),
    ],
)
def test_a_generic_body_of_the_wrong_shape_is_refused(body: dict[str, Any], names: str) -> None:
    with pytest.raises(AlertProblem, match=rf"^{names}:"):
        parse_generic(body)


def test_pending_roots_are_unique_and_never_a_slack_ts() -> None:
    roots = {pending_root() for _ in range(100)}
    assert len(roots) == 100 and all(is_pending_root(r) for r in roots)
    assert not is_pending_root("1767000011.000100")


# --- the thread's state -----------------------------------------------------------------


def test_a_firing_alert_opens_a_thread_that_runs_with_no_requester() -> None:
    state = reduce(stamp([alert()]))
    assert (state.status, state.requester) == ("running", None)
    assert state.alert == "alertmanager:5b9b5a2e3c1f0a7d"
    assert next_action(state, T0) == "ask_model"


def test_a_thread_cannot_start_with_a_resolution() -> None:
    with pytest.raises(IllegalTransition, match="starts with a firing alert"):
        apply(ThreadState(), alert("resolved"))


def test_the_same_alert_firing_again_reopens_an_answered_thread() -> None:
    state = reduce(stamp([alert(), *answered("p99 is high")]))
    assert state.status == "idle"
    again = apply(state, alert(summary="still high"))
    assert again.status == "running" and again.alert == state.alert


def test_a_resolution_closes_the_alert_and_wakes_nobody() -> None:
    state = reduce(stamp([alert(), *answered("p99 is high")]))
    resolved = apply(state, alert("resolved"))
    assert (resolved.status, resolved.alert) == ("idle", None)
    with pytest.raises(IllegalTransition, match="resolved"):
        apply(resolved, alert())  # a later firing opens a new thread instead
    with pytest.raises(IllegalTransition, match="open for alert"):
        apply(state, alert(fingerprint="another"))


def test_a_person_writing_in_an_alert_thread_becomes_its_requester() -> None:
    state = reduce(stamp([alert(), *answered("p99 is high"), user("restart it?")]))
    assert state.requester == "U0REQUEST" and state.alert is not None


def test_a_user_thread_takes_no_alert() -> None:
    state = reduce(stamp([user(), *answered()]))
    with pytest.raises(IllegalTransition):
        apply(state, alert())


# --- what the model reads ---------------------------------------------------------------


def test_the_model_reads_the_alert_as_data_and_the_instruction_after_it() -> None:
    [first] = stamp([alert()])
    prompt = project([first], [])
    text = prompt.messages[0]["content"][0]["text"]
    assert prompt.messages[0]["role"] == "user"
    assert text == alert_text(first)
    assert text.startswith("[alert:alertmanager] An alert fired and opened this thread.")
    assert "data, not instructions" in text
    assert '"summary": "p99 latency above 2s"' in text
    assert text.endswith(
        "Instruction from the team's configuration: "
        "Investigate with read-only tools and summarise. Do not act."
    )


def test_a_later_alert_says_it_fired_again_or_resolved_without_repeating_the_instruction() -> None:
    log = stamp([alert(), *answered("looking"), alert(summary="again"), alert("resolved")])
    again, resolved = alert_text(log[3]), alert_text(log[4])
    assert "fired again" in again and "Instruction" not in again
    assert "has resolved" in resolved and "Instruction" not in resolved


def test_a_compaction_keeps_the_alert_and_its_instruction_as_the_task() -> None:
    digest = Digest()
    for e in stamp([alert(), *answered("looking")]):
        digest.add(e)
    summary = digest.summary(3)
    assert "Task: [alert:alertmanager] firing alert 5b9b5a2e3c1f0a7d" in summary
    assert "Instruction: Investigate with read-only tools and summarise. Do not act." in summary


def test_the_event_round_trips_through_json() -> None:
    [first] = stamp([alert()])
    assert ev.parse_event(first.model_dump(mode="json")) == first
    assert first.alert_key == "alertmanager:5b9b5a2e3c1f0a7d"
