"""Slack mrkdwn: untrusted text escaped, mentions and dates, cut within Slack's limits."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from bot import mrkdwn as md
from tests.bot.render.support import EVIL, NOW, THREAD


def test_escape_neutralises_mentions_links_and_entities() -> None:
    assert md.escape(EVIL) == (
        "&lt;!channel&gt; &lt;@U999&gt; &lt;https://evil.example|bank&gt; &amp; stuff"
    )
    assert md.escape("&amp;") == "&amp;amp;"  # shown as the model wrote it


def test_escape_drops_control_and_bidi_characters() -> None:
    assert md.escape("pay \u202e0005\u202c now\x00\x1b[31m\n") == "pay 0005 now[31m\n"


def test_mention_only_for_slack_user_ids() -> None:
    assert md.mention("U0123ABC") == "<@U0123ABC>"
    assert md.mention("W0123ABC") == "<@W0123ABC>"
    assert md.mention("<!here>") == "&lt;!here&gt;"
    assert md.mention("u0123abc") == "u0123abc"
    assert md.mention("U12>|x") == "U12&gt;|x"
    assert md.mention(None) == "someone"
    assert md.group_mention("S0GROUP01") == "<!subteam^S0GROUP01>"
    assert md.group_mention("S0<x") == "S0&lt;x"


def test_date_token_has_a_utc_fallback() -> None:
    assert md.date(NOW) == (
        f"<!date^{int(NOW.timestamp())}^{{date_short_pretty}} at {{time}}|2026-01-02 09:30 UTC>"
    )


def test_truncate_appends_the_pointer_within_the_limit() -> None:
    pointer = md.trace_pointer(THREAD)
    out = md.truncate("x" * 5000, 3000, pointer)
    assert len(out) == 3000 and out.endswith(pointer)
    assert pointer == f"… (truncated; full text: `opsloop trace {THREAD}`)"
    assert md.truncate("short", 3000, pointer) == "short"


def test_truncate_never_cuts_an_entity_a_token_or_a_grapheme() -> None:
    assert md.truncate("ab&amp;cd", 6) == "ab…"
    assert md.truncate("hi <@U0REQUEST1> there", 10) == "hi…"
    assert md.truncate("👍🏽👍🏽👍🏽", 5) == "👍🏽…"
    assert md.truncate("e\u0301e\u0301e\u0301", 4) == "e\u0301…"
    assert md.truncate("🇫🇷🇩🇪🇮🇹", 7) == "🇫🇷…"
    assert md.truncate("👩‍👩‍👧‍👦👩‍👩‍👧‍👦", 12) == "👩‍👩‍👧‍👦…"


def test_lengths_count_utf16_units_like_the_strictest_reading_of_slack() -> None:
    assert md.slack_len("𝕏") == 2
    assert md.slack_len(md.truncate("𝕏" * 100, 11)) <= 11


def test_code_block_cannot_be_closed_by_the_text() -> None:
    out = md.code_block("a ``` b ```` c `x`", 200)
    assert out.startswith("```\n") and out.endswith("\n```")
    assert out.count("```") == 2


def test_code_block_is_cut_inside_the_fence_with_the_pointer_after_it() -> None:
    pointer = md.trace_pointer(THREAD)
    out = md.code_block("<" * 10_000, 500, pointer)
    assert md.slack_len(out) <= 500
    assert out.endswith("\n```\n" + pointer)
    assert out.count("```") == 2
    assert "&lt;…\n```" in out  # whole entities up to the ellipsis


@given(st.text(max_size=400), st.integers(min_value=0, max_value=300))
def test_truncate_respects_any_limit(text: str, limit: int) -> None:
    out = md.truncate(md.escape(text), limit, "…")
    assert md.slack_len(out) <= limit
    assert not re.search(r"&(?!amp;|lt;|gt;)", out)
    if md.slack_len(md.escape(text)) <= limit:
        assert out == md.escape(text)


@given(st.text(max_size=400), st.integers(min_value=40, max_value=300))
def test_code_block_is_always_one_closed_fence(text: str, limit: int) -> None:
    out = md.code_block(text, limit, md.trace_pointer(THREAD))
    assert md.slack_len(out) <= limit
    assert out.count("```") in (0, 2)  # 0 only when not even a fence fits
    assert "<" not in out.replace(md.trace_pointer(THREAD), "")


@given(st.text(alphabet=st.sampled_from("ab <>&\n`"), max_size=3000))
def test_split_text_chunks_fit_and_keep_fences_balanced(text: str) -> None:
    for chunk in md.split_text(md.escape(text), 200):
        assert md.slack_len(chunk) <= 200


def test_split_text_keeps_every_character_and_reopens_cut_fences() -> None:
    prose = " ".join(f"word{i}" for i in range(2000))
    assert "".join(md.split_text(prose, 3000)) == prose
    code = "intro\n```\n" + "line\n" * 2000 + "```\nafter"
    chunks = md.split_text(code, 3000)
    assert len(chunks) > 2
    assert all(c.count("```") % 2 == 0 for c in chunks)
    assert all(c.startswith("```\n") for c in chunks[1:-1])
