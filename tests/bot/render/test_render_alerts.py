"""The post an alert's thread opens on, and the lines of the same alert later."""

from __future__ import annotations

import json

from bot.limits import check_limits
from bot.outbox import Outbound, StatusView, pending_deliveries, render
from bot.render.alerts import LABELS_SHOWN, alert_line, alert_root
from bot.render.status import CANCEL_ACTION
from engine import events as ev
from engine.state import reduce
from tests.bot.render.support import all_text
from tests.support.logs import alert, answered, stamp


def test_the_root_says_firing_with_the_summary_source_labels_and_link() -> None:
    e = alert(
        summary="p99 *above* 2s",
        url="https://prometheus.example/graph?g0.expr=a&g0.tab=1",
        annotations={"description": "p99 is 2.4s for 10 minutes"},
    )
    text = all_text(alert_root(e))
    assert text.startswith("🔥 *Firing* · *p99 ∗above∗ 2s*")  # its own * cannot unbold
    assert "p99 is 2.4s for 10 minutes" in text
    assert "Alertmanager · `5b9b5a2e3c1f0a7d` · alertname=HighLatency, service=api" in text
    assert "<https://prometheus.example/graph?g0.expr=a&amp;g0.tab=1|Open in the source>" in text
    resolved = all_text(alert_root(e, resolved=True))
    assert resolved.startswith("✅ *Resolved* · ") and "Firing" not in resolved


def test_a_root_without_link_or_details_says_what_it_has() -> None:
    text = all_text(alert_root(alert(url="", labels={})))
    assert "Open in the source" not in text and "=" not in text


def test_many_labels_are_counted_not_all_shown() -> None:
    labels = {f"l{i:02d}": "v" for i in range(20)}
    text = all_text(alert_root(alert(labels=labels)))
    assert f"(+{20 - LABELS_SHOWN})" in text and "l07=v" in text and "l08=v" not in text


def test_later_alerts_are_lines_saying_fired_again_or_resolved() -> None:
    assert "fired again: p99" in all_text(alert_line(alert(summary="p99 still high")))
    assert "alert resolved" in all_text(alert_line(alert("resolved")))


def test_the_thread_s_status_is_shown_on_its_root_post_at_the_top_of_the_channel() -> None:
    log = stamp([alert(), *answered("p99 is high")])
    [root, answer] = pending_deliveries(log)
    assert root.kind == "post" and root.status is not None and root.status.root == log[0]
    assert root.event == log[0] and root.requester is None
    blocks = render(root)
    assert "Firing" in all_text(blocks) and "Done" in all_text(blocks)
    assert answer.event.type == "final_answer"  # no status message of its own in the thread


def test_the_root_is_updated_when_the_alert_resolves_and_the_cancel_button_goes() -> None:
    opened, *said = [alert(), *answered("p99 is high")]
    final = said[-1]
    posted = [  # the root (the status: after the answer) and the answer's line
        ev.MessagePosted(shows_event_id=opened.event_id, channel="C0ALERTS", ts="1.1"),
        ev.MessagePosted(shows_event_id=final.event_id, channel="C0ALERTS", ts="1.1"),
        ev.MessagePosted(shows_event_id=final.event_id, channel="C0ALERTS", ts="1.2"),
    ]
    shown = stamp([opened, *said, *posted])
    assert pending_deliveries(shown) == []  # all shown: nothing to do
    resolved = stamp([alert("resolved")], start=len(shown) + 1)
    todo = pending_deliveries([*shown, *resolved])
    kinds = sorted((o.kind, o.event.type) for o in todo)
    assert kinds == [("post", "alert_received"), ("update", "alert_received")]
    [update] = [o for o in todo if o.kind == "update"]
    assert update.card_ts == "1.1" and isinstance(update.status, StatusView)
    text = json.dumps(render(update))
    assert "Resolved" in text and CANCEL_ACTION not in text  # idle: nothing to cancel
    assert reduce([*shown, *resolved]).alert is None


def test_render_of_a_root_is_within_slack_limits() -> None:
    labels = {f"k{i}": "v" * 2000 for i in range(64)}
    [first] = stamp([alert(summary="x" * 5000, labels=labels)])
    view = StatusView(reduce([first]), first.event_id, first.event_id, root=first)
    assert check_limits(render(Outbound("post", first, None, status=view))) == []
