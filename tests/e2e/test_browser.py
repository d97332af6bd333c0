"""The local workspace in a real browser: what a newcomer does after ``make run``.

``opsloop local`` runs as a real process (offline phrasebook model, demo tools, SQLite)
and headless Chromium (Debian's ``chromium``, driven by Playwright: conftest.py) clicks
through the page as alice, who asks, and bob and carol, who review: a deploy, a
rejection, a clarification, a job, the quorum of two for production, the reconcile card
of a call the catalog MCP server crashed in the middle of, a deploy through the local
GitHub's CI that only the on-call user may approve, and the "Fire an alert" button.

``OPSLOOP_SCREENSHOT_DIR=docs`` writes the README's screenshot there
(``docs/local-approval.png``); otherwise it goes to the test's temporary folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from bot.render.approval import APPROVE_ACTION, EDIT_ACTION, GRANT_ACTION, REJECT_ACTION
from bot.render.edit import APPROVE_BLOCK
from bot.render.grants import SCOPE_BLOCK
from bot.render.reconcile import HAPPENED_ACTION

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"


def be(page, user: str) -> None:
    page.get_by_test_id("user-switcher").select_option(user)


def ask(page, text: str) -> Any:
    """alice writes ``text`` to the bot in #ops; returns the thread pane once the bot
    has answered in the thread."""
    be(page, ALICE)
    page.get_by_test_id("composer-input").fill(f"@opsloop {text}")
    page.get_by_test_id("composer-send").click()
    mine = page.get_by_test_id("message-list").get_by_test_id("message").filter(has_text=text)
    mine.last.get_by_test_id("open-thread").click()
    pane = page.get_by_test_id("thread-pane")
    pane.wait_for()
    return pane


def button(pane, action_id: str) -> Any:
    return pane.locator(f'[data-testid="block-button"][data-action-id="{action_id}"]').last


def approve(page, pane) -> None:
    """The current user clicks Approve and confirms in the dialog the card's button asks for."""
    button(pane, APPROVE_ACTION).click()
    dialog = page.get_by_test_id("confirm-dialog")
    dialog.wait_for()
    # "Approve …?": true for every clicker, whether or not this vote is the last one.
    assert page.get_by_test_id("confirm-title").inner_text().startswith("Approve ")
    page.get_by_test_id("confirm-ok").click()
    dialog.wait_for(state="hidden")


def bot_says(pane, text: str) -> None:
    pane.locator('[data-testid="message"][data-bot="true"]').filter(has_text=text).last.wait_for()


def test_a_deploy_is_approved_by_bob_and_the_answer_arrives(page, tmp_path: Path) -> None:
    pane = ask(page, "deploy api to staging")
    approve_button = button(pane, APPROVE_ACTION)
    approve_button.wait_for()
    assert button(pane, REJECT_ACTION).get_attribute("data-style") == "danger"
    assert approve_button.get_attribute("data-style") == "primary"

    be(page, BOB)
    shots = Path(os.environ.get("OPSLOOP_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "local-approval.png"))

    approve(page, pane)
    bot_says(pane, "Deployed api")
    # The card is updated in place: no buttons left, bob named as the reviewer.
    assert button(pane, APPROVE_ACTION).count() == 0
    assert "bob" in pane.inner_text().lower()


def test_a_rejection_with_a_reason_is_what_the_bot_answers(page) -> None:
    pane = ask(page, "deploy api version 9.9.9 to production")
    button(pane, APPROVE_ACTION).wait_for()
    be(page, BOB)
    button(pane, REJECT_ACTION).click()  # no confirm: the modal asks for a reason
    modal = page.get_by_test_id("modal")
    modal.wait_for()
    modal.get_by_test_id("modal-input").first.fill("change freeze until Monday")
    modal.get_by_test_id("modal-submit").click()
    modal.wait_for(state="hidden")
    bot_says(pane, "change freeze until Monday")
    assert "not deployed" in pane.inner_text().lower()


def test_a_clarification_is_answered_in_the_thread(page) -> None:
    pane = ask(page, "deploy")
    bot_says(pane, "Which service")
    pane.get_by_test_id("thread-composer-input").fill("billing")
    pane.get_by_test_id("thread-composer-send").click()
    button(pane, APPROVE_ACTION).wait_for()
    be(page, BOB)
    approve(page, pane)
    bot_says(pane, "Deployed billing")


def test_production_needs_bob_and_carol_and_the_card_counts_the_votes(page) -> None:
    pane = ask(page, "deploy api version 1.4.2 to production")
    button(pane, APPROVE_ACTION).wait_for()
    be(page, BOB)
    approve(page, pane)
    pane.get_by_text("1 of 2: @bob").wait_for()  # the card stays open for the second vote
    assert button(pane, APPROVE_ACTION).count() == 1
    be(page, CAROL)
    approve(page, pane)
    bot_says(pane, "Deployed api 1.4.2 to production")
    assert button(pane, APPROVE_ACTION).count() == 0


def test_bob_edits_staging_to_production_which_then_needs_carol_too(page) -> None:
    """Issue 17 §2: Edit opens the arguments modal; saving (and approving) re-applies the
    rules, so production's quorum of two holds, and the call runs as edited."""
    pane = ask(page, "deploy api version 1.4.2 to staging")
    button(pane, APPROVE_ACTION).wait_for()
    be(page, BOB)
    button(pane, EDIT_ACTION).click()
    modal = page.get_by_test_id("modal")
    modal.wait_for()
    field = modal.locator('[data-testid="modal-input"][data-block-id="arg:environment"]')
    assert field.input_value() == '"staging"'
    field.select_option('"production"')
    modal.locator(f'[data-block-id="{APPROVE_BLOCK}"] input[type="checkbox"]').check()
    modal.get_by_test_id("modal-submit").click()
    modal.wait_for(state="hidden")
    pane.get_by_text("environment: staging → production").wait_for()
    pane.get_by_text("1 of 2: @bob").wait_for()  # production's rule: carol must approve too
    be(page, CAROL)
    approve(page, pane)
    bot_says(pane, "Deployed api 1.4.2 to production")


def test_bob_grants_restarts_for_the_channel_and_the_next_one_runs_at_once(page) -> None:
    """Issue 17 §4: "Approve for 1 h" opens the grant's form; bob lets it cover the whole
    channel, so alice's next restart, in a thread of its own, runs without a card."""
    pane = ask(page, "restart api")
    button(pane, GRANT_ACTION).wait_for()
    be(page, BOB)
    button(pane, GRANT_ACTION).click()
    modal = page.get_by_test_id("modal")
    modal.wait_for()
    scope = modal.locator(f'[data-testid="modal-input"][data-block-id="{SCOPE_BLOCK}"]')
    scope.select_option("channel")
    modal.get_by_test_id("modal-submit").click()
    modal.wait_for(state="hidden")
    bot_says(pane, "Restarted api")
    pane.get_by_text("also granted calls of").wait_for()
    again = ask(page, "restart the api service")  # another thread: another text to find
    again.get_by_text("restart #2").wait_for()
    again.get_by_text("grant until").wait_for()
    assert button(again, APPROVE_ACTION).count() == 0  # no card: the grant approved it


def test_a_crash_mid_call_asks_bob_what_happened_and_his_note_is_the_answer(page) -> None:
    pane = ask(page, "scale api to 5 replicas and simulate a crash")
    button(pane, APPROVE_ACTION).wait_for()
    be(page, BOB)
    approve(page, pane)
    happened = button(pane, HAPPENED_ACTION)
    happened.wait_for()  # the reconcile card: the catalog died after making the change
    happened.click()
    modal = page.get_by_test_id("modal")
    modal.wait_for()
    modal.get_by_test_id("modal-input").first.fill("the catalog shows 5 replicas")
    modal.get_by_test_id("modal-submit").click()
    modal.wait_for(state="hidden")
    bot_says(pane, "the catalog shows 5 replicas")
    assert button(pane, HAPPENED_ACTION).count() == 0
    assert "said it happened" in pane.inner_text()


def test_a_production_deploy_through_ci_waits_for_the_on_call_user_and_its_run(page) -> None:
    """Local mode's GitHub and PagerDuty: carol reviews but is not on call, so her click
    is refused; bob is on call, and after his the workflow runs (some seconds in the
    local GitHub), whose webhook ends the wait and the run's end is the answer."""
    pane = ask(page, "deploy api to production through CI")
    button(pane, APPROVE_ACTION).wait_for()
    pane.get_by_text("On call now").first.wait_for()  # the card names whoever is on call
    be(page, CAROL)
    approve(page, pane)
    pane.locator('[data-testid="message"][data-ephemeral="true"]').filter(
        has_text="nor on call for it now"
    ).last.wait_for()
    assert button(pane, APPROVE_ACTION).count() == 1  # still open: nobody has approved
    be(page, BOB)
    approve(page, pane)
    pane.get_by_text("Waiting for deploy.yml on acme/platform").first.wait_for()
    bot_says(pane, "Deployed api to production through CI")
    assert "succeeded in" in pane.inner_text()


def test_fire_an_alert_opens_a_thread_the_bot_investigates(page) -> None:
    """The sidebar's button plays the monitoring system: a signed POST /alerts/generic;
    the bot posts the alert in #ops and looks into it, read-only, in its thread."""
    be(page, ALICE)
    page.get_by_test_id("fire-alert").click()
    page.get_by_test_id("channel-header").filter(has_text="ops").wait_for()
    posted = page.get_by_test_id("message-list").locator('[data-testid="message"][data-bot="true"]')
    root = posted.filter(has_text="5xx responses above 5%").last
    root.get_by_test_id("open-thread").click()
    pane = page.get_by_test_id("thread-pane")
    pane.wait_for()
    bot_says(pane, "I only looked: nothing was changed")
    assert "api is healthy" in pane.inner_text()


def test_a_job_wait_completes_and_the_thread_is_told(page) -> None:
    pane = ask(page, "run the backfill job for 2 seconds")
    bot_says(pane, "succeeded")


# --- the page at 1024 px with the trace open ------------------------------------------------

NARROW = {"width": 1024, "height": 768}
MIN_CHANNEL_PX = 260


def box(locator) -> dict[str, float]:
    found = locator.bounding_box()
    assert found is not None, locator
    return found


def right(b: dict[str, float]) -> float:
    return b["x"] + b["width"]


MIN_CHIPS_SHOWN = 5  # one scrolling row showed two or three (issue 15 §11)
MAX_CHIPS_PX = 140  # a few rows; past them the box scrolls and the messages keep their room


def assert_chips_wrap(page) -> None:
    """The phrase chips wrap over rows in the channel pane: most are in view, none is
    cut at the box's edge, and the box stays a few rows high."""
    chips = page.evaluate(
        """() => {
             const box = document.querySelector('[data-testid="suggestions"]');
             const b = box.getBoundingClientRect();
             return [...box.querySelectorAll('[data-testid="suggestion"]')].map((chip) => {
               const r = chip.getBoundingClientRect();
               return { top: Math.round(r.top), left: r.left >= b.left - 1,
                        right: r.right <= b.right + 1,
                        shown: r.top >= b.top - 1 && r.bottom <= b.bottom + 1 };
             });
           }"""
    )
    assert chips and all(c["left"] and c["right"] for c in chips), chips  # none cut sideways
    shown = [c for c in chips if c["shown"]]
    assert len(shown) >= MIN_CHIPS_SHOWN, chips
    assert len({c["top"] for c in shown}) >= 3, chips  # on rows, not one scrolling line
    assert box(page.get_by_test_id("suggestions"))["height"] <= MAX_CHIPS_PX


def test_at_1024_px_the_panes_sit_side_by_side_and_the_trace_reads(page, tmp_path: Path) -> None:
    """Both at once: one server start keeps the browser tests short."""
    page.set_viewport_size(NARROW)
    pane = ask(page, "check health of api")
    bot_says(pane, "api is healthy")
    pane.get_by_test_id("trace-toggle").click()
    trace = page.get_by_test_id("trace-panel")
    result = trace.locator('[data-testid="trace-event"][data-type="tool_result"]').last
    result.wait_for()
    page.screenshot(path=str(tmp_path / "local-1024-trace.png"))

    channel, composer = (
        box(page.get_by_test_id("channel-pane")),
        box(page.get_by_test_id("composer")),
    )
    thread, panel = box(pane), box(trace)
    assert channel["width"] >= MIN_CHANNEL_PX, channel
    assert right(composer) <= thread["x"] + 1 and composer["width"] >= MIN_CHANNEL_PX - 40
    assert right(thread) <= panel["x"] + 1 and right(panel) <= NARROW["width"] + 1
    assert min(thread["width"], panel["width"]) >= 260, (thread, panel)
    # The phrase chips stay in the channel pane: at the thread's left edge, level with
    # each chip, the thread is what is there.
    spilled = page.evaluate(
        """(x) => [...document.querySelectorAll('[data-testid="suggestion"]')].filter((chip) => {
             const r = chip.getBoundingClientRect();
             const at = document.elementFromPoint(x, r.top + r.height / 2);
             return at && chip.contains(at);
           }).map((chip) => chip.dataset.phrase)""",
        thread["x"] + 4,
    )
    assert spilled == []
    assert_chips_wrap(page)

    # message_posted rows are folded behind one "N deliveries" toggle.
    posted = trace.locator('[data-testid="trace-event"][data-type="message_posted"]')
    toggle = trace.get_by_test_id("trace-deliveries")
    # Read in one go: the trace is drawn again whenever the thread changes.
    label, count, rows, shown = trace.evaluate(
        """(panel) => {
             const toggle = panel.querySelector('[data-testid="trace-deliveries"]');
             const rows = [...panel.querySelectorAll('[data-type="message_posted"]')];
             return [toggle.innerText.trim(), Number(toggle.dataset.count), rows.length,
                     rows.filter((row) => row.checkVisibility()).length];
           }"""
    )
    assert count == rows > 0 and shown == 0
    assert re.fullmatch(rf"{count} deliver(y|ies)", label)
    toggle.click()
    posted.first.wait_for()
    assert toggle.get_attribute("aria-pressed") == "true"

    # A tool result: a summary line, its output as pretty JSON behind a toggle, neutral.
    assert "healthy" in result.get_by_test_id("trace-summary").inner_text()
    output = result.get_by_test_id("trace-result-json")
    assert not output.is_visible()
    result.get_by_test_id("trace-result-toggle").click()
    output.wait_for()
    assert '\n  "status": "healthy"' in output.inner_text()
    neutral = "rgb(29, 28, 29)"
    assert output.evaluate("(e) => getComputedStyle(e).color") == neutral
    # The failed first attempt is marked as an error; its text stays neutral too.
    failed = trace.locator('[data-testid="trace-event"][data-type="retry_scheduled"]').first
    assert failed.get_attribute("data-error") == "true"
    failed.get_by_test_id("trace-error-badge").wait_for()
    summary = failed.get_by_test_id("trace-summary")
    assert "health endpoint timed out" in summary.inner_text()
    assert summary.evaluate("(e) => getComputedStyle(e).color") == neutral
    page.screenshot(path=str(tmp_path / "local-1024-trace-unfolded.png"))


def test_at_1024_px_a_quote_reads_as_one_and_a_refused_click_is_no_error(
    page, tmp_path: Path
) -> None:
    """Issue 15 §11: the answer's "> reason" is a quote, not a literal ">"; alice's
    refused click on her own card (a safeguard working) is marked in the trace, but not
    as an error; every actor in the trace shows whole."""
    page.set_viewport_size(NARROW)
    pane = ask(page, "deploy api to staging")
    button(pane, APPROVE_ACTION).click()  # alice's own call: not hers to approve
    dialog = page.get_by_test_id("confirm-dialog")
    dialog.wait_for()
    page.get_by_test_id("confirm-ok").click()
    # The refusal is recorded before she is told, privately, in the thread.
    pane.locator('[data-testid="message"][data-ephemeral="true"]').filter(
        has_text="Nothing changed"
    ).last.wait_for()

    be(page, BOB)
    button(pane, REJECT_ACTION).click()
    modal = page.get_by_test_id("modal")
    modal.wait_for()
    modal.get_by_test_id("modal-input").first.fill("change freeze until Monday")
    modal.get_by_test_id("modal-submit").click()
    modal.wait_for(state="hidden")
    answer = pane.locator('[data-testid="message"][data-bot="true"]').filter(
        has=page.locator("blockquote.md-quote", has_text="change freeze until Monday")
    )
    answer.last.wait_for()
    answer.last.screenshot(path=str(tmp_path / "local-1024-quote.png"))
    text = answer.last.get_by_test_id("message-text").inner_text()
    assert not [line for line in text.splitlines() if line.lstrip().startswith(">")], text

    pane.get_by_test_id("trace-toggle").click()
    trace = page.get_by_test_id("trace-panel")
    refused = trace.locator('[data-testid="trace-event"][data-type="approval_refused"]').first
    refused.wait_for()
    page.screenshot(path=str(tmp_path / "local-1024-refused.png"))
    assert refused.get_attribute("data-error") is None
    assert refused.get_attribute("data-refused") == "true"
    assert refused.get_by_test_id("trace-error-badge").count() == 0
    badge = refused.get_by_test_id("trace-refused-badge")
    assert badge.inner_text().strip().lower() == "refused"
    danger = "rgb(192, 57, 43)"
    assert badge.evaluate("(e) => getComputedStyle(e).color") != danger
    assert refused.get_by_test_id("trace-actor").inner_text() == "@alice"

    # Every actor whole: none cut to "@…", none wider than the room it is shown in.
    actors = trace.evaluate(
        """(panel) => {
             const edge = panel.getBoundingClientRect().right + 1;
             return [...panel.querySelectorAll('[data-testid="trace-actor"]')]
               .filter((a) => a.checkVisibility())
               .map((a) => [a.innerText, a.scrollWidth <= a.clientWidth + 1,
                            a.getBoundingClientRect().right <= edge]);
           }"""
    )
    assert actors and all(whole and inside for _, whole, inside in actors), actors
    names = {name for name, _, _ in actors}
    assert {"@alice", "@bob"} <= names and not any("…" in n for n in names), names
