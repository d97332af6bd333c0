"""engine.chat_markup: Slack's message markup decoded into what a person reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.chat_markup import decode, decoded, names_from, unescape

NAMES = {"U0ALICE": "alice", "U0BOB": "Bob Smith"}


@pytest.mark.parametrize(
    ("sent", "shown"),
    [
        ("deploy &lt;api&gt; &amp; web", "deploy <api> & web"),
        ("a &amp;lt; b", "a &lt; b"),  # decoded once: the person typed "&lt;"
        ("ask <@U0ALICE> and <@U0BOB>", "ask @alice and @Bob Smith"),
        ("ask <@U0CAROL>", "ask @U0CAROL"),  # no name known
        ("ask <@U0CAROL|carol>", "ask @carol"),
        ("<@U0ALICE|old-name> hi", "@alice hi"),  # the front door's name wins
        ("see <#C0OPS|ops>", "see #ops"),
        ("see <#C0OPS>", "see #C0OPS"),
        (
            "<https://x.example/a?b=1&amp;c=2|the runbook>",
            "the runbook (https://x.example/a?b=1&c=2)",
        ),
        ("<https://x.example/>", "https://x.example/"),
        ("<http://example.com|example.com>", "example.com"),  # a bare domain, auto-linked
        ("<mailto:bob@example.com|bob@example.com>", "bob@example.com"),
        ("<!here> the api is down", "@here the api is down"),
        ("<!channel> <!everyone>", "@channel @everyone"),
        ("<!subteam^S0SRE|@sre> please", "@sre please"),
        ("<!subteam^S0SRE>", "@S0SRE"),
        ("<!date^1392734382^{date}|Feb 18, 2014>", "Feb 18, 2014"),
        ("<https://x.example|a &lt;b&gt;>", "a <b> (https://x.example)"),
        ("no markup at all", "no markup at all"),
    ],
)
def test_slack_markup_reads_as_the_person_saw_it(sent: str, shown: str) -> None:
    assert decode(sent, NAMES) == shown


def test_unescape_leaves_other_ampersands_alone() -> None:
    assert unescape("R&D &quot; &amp;&amp;") == "R&D &quot; &&"


def test_only_text_from_slack_is_decoded() -> None:
    slack = {"kind": "slack", "names": {"U0ALICE": "alice"}}
    assert decoded("hi <@U0ALICE> &amp;", slack) == "hi @alice &"
    assert decoded("hi <@U0ALICE> &amp;", {}) == "hi <@U0ALICE> &amp;"
    assert decoded("a &lt; b", {"kind": "webhook"}) == "a &lt; b"


def test_names_that_are_not_strings_are_ignored() -> None:
    source = {"names": {"U1": "alice", "U2": 7, "U3": "", 4: "x"}}
    assert names_from(source) == {"U1": "alice"}
    assert names_from({"names": ["U1"]}) == {}
    assert decoded("<@U2>", {"kind": "slack", **source}) == "@U2"


def test_the_decoder_is_pure() -> None:
    tree = ast.parse((Path(__file__).parents[2] / "engine" / "chat_markup.py").read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"__future__", "re", "collections.abc", "typing"}
