"""The page's rendering of a plan message's answer and feedback row (blocks.js and
markdown.js in Node, without a browser; tests/e2e has the browser's view)."""

from __future__ import annotations

from pathlib import Path

from tests.localslack.test_page import render

FEEDBACK = {
    "type": "context_actions",
    "block_id": "opsloop_feedback|thr_1|2.000001",
    "elements": [
        {
            "type": "feedback_buttons",
            "action_id": "opsloop_feedback",
            "positive_button": {
                "text": {"type": "plain_text", "text": "Good response"},
                "accessibility_label": "This answer helped",
                "value": "up",
            },
            "negative_button": {
                "text": {"type": "plain_text", "text": "Bad response"},
                "value": "down",
            },
        }
    ],
}


def test_a_mention_the_app_writes_in_markdown_shows_as_a_mention(tmp_path: Path) -> None:
    """ "Stopped by <@U…>" (bot.render.plan) reads as a mention, as Slack shows it; the
    model's escaped "&lt;@U…&gt;" stays text."""
    text = "⏹️ Stopped by <@U0ALICE>. Said: &lt;@U0BOB&gt; and <#C0OPS>, **done**"
    html = render([{"type": "markdown", "text": text}], tmp_path)
    assert '<span class="md-mention">@U0ALICE</span>' in html
    assert "&lt;@U0BOB&gt;" in html and 'md-mention">@U0BOB' not in html
    assert 'class="md-channel" href="#/C0OPS"' in html
    assert '<strong class="md-strong">done</strong>' in html


def test_the_feedback_row_shows_thumbs_with_the_words_as_tooltips(tmp_path: Path) -> None:
    html = render([FEEDBACK], tmp_path)
    assert 'title="Good response"' in html and 'title="Bad response"' in html
    assert ">👍</button>" in html and ">👎</button>" in html
    assert "Good response</button>" not in html
