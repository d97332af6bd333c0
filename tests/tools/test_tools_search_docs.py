"""search_docs ranks Markdown lines deterministically."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.config import load_settings
from tools import ToolContext
from tools.builtin import docs as docs_module
from tools.builtin.docs import SearchDocsArgs, score_line, search_docs

CTX = ToolContext(thread_id="t", tool_call_id="c", idempotency_key="k", attempt=1)


@pytest.fixture
def docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "docs"
    (root / "runbooks").mkdir(parents=True)
    (root / "runbooks" / "refunds.md").write_text(
        "# Refund runbook\n"
        "\n"
        "Refunds over $500 need approval.\n"
        "Use the refund tool with the order id.\n"
    )
    (root / "faq.md").write_text("# FAQ\n\nHow do I issue a refund?\nAsk finance.\n")
    (root / "other.md").write_text("# Deploys\n\nNothing relevant here.\n")
    (root / "notes.txt").write_text("refund refund refund refund\n")  # not Markdown
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.md").write_text("refund refund refund refund\n")
    monkeypatch.setattr(docs_module, "_docs_dir", docs_module._docs_dir)  # restored after
    docs_module.configure(load_settings({"OPSLOOP_DOCS_DIR": str(root)}).tool)
    return root


def test_score_line_prefers_headings_and_coverage() -> None:
    terms = ["refund", "approval"]
    assert score_line("nothing here", terms) == 0.0
    plain = score_line("refund", terms)
    heading = score_line("# refund", terms)
    both = score_line("refund approval", terms)
    assert heading > plain and both > plain


@pytest.mark.asyncio
async def test_ranking_and_shape(docs: Path) -> None:
    out = await search_docs(SearchDocsArgs(query="Refund approval", limit=10), CTX)
    assert out["query"] == "Refund approval"
    assert "note" not in out
    results = out["results"]
    # score = term hits + share of query terms matched (+1 per matched term on a heading)
    assert [(r["file"], r["line"], r["score"]) for r in results] == [
        ("runbooks/refunds.md", 3, 3.0),  # both terms: 1 + 1 + 1.0
        ("runbooks/refunds.md", 1, 2.5),  # heading: 1 + 0.5 + 1
        ("faq.md", 3, 1.5),  # tie at 1.5 broken by file, then line
        ("runbooks/refunds.md", 4, 1.5),
    ]
    assert "Refunds over $500" in results[0]["snippet"]
    assert results[1]["snippet"].startswith("# Refund runbook")
    assert all(not r["file"].startswith(".") for r in results)
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.asyncio
async def test_limit_and_snippet_length(docs: Path) -> None:
    (docs / "long.md").write_text("refund " + "x" * 1000 + "\n")
    out = await search_docs.run(SearchDocsArgs(query="refund", limit=2), CTX)
    assert len(out["results"]) == 2
    full = await search_docs.run(SearchDocsArgs(query="refund", limit=20), CTX)
    long_hit = next(r for r in full["results"] if r["file"] == "long.md")
    assert len(long_hit["snippet"]) <= 300


@pytest.mark.asyncio
async def test_missing_folder_is_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docs_module, "_docs_dir", tmp_path / "nope")
    out = await search_docs(SearchDocsArgs(query="refund"), CTX)
    assert out["results"] == []
    assert "does not exist" in out["note"]


@pytest.mark.asyncio
async def test_default_folder_is_cwd_docs(docs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs_module.configure(load_settings({}).tool)  # no OPSLOOP_DOCS_DIR: ./docs
    monkeypatch.chdir(docs.parent)
    out = await search_docs(SearchDocsArgs(query="finance"), CTX)
    assert [(r["file"], r["line"]) for r in out["results"]] == [("faq.md", 4)]


def test_args_bounds() -> None:
    with pytest.raises(ValueError):
        SearchDocsArgs(query="")
    with pytest.raises(ValueError):
        SearchDocsArgs(query="x", limit=21)
    assert search_docs.input_schema()["required"] == ["query"]


def _snippets(root: Path, query: str, limit: int = 20) -> list[str]:
    return [r["snippet"] for r in docs_module.search(root, query, limit)["results"]]


def test_a_snippet_is_whole_sentences_from_the_one_that_matched(tmp_path: Path) -> None:
    (tmp_path / "ops.md").write_text(
        "# Ops\n"
        "\n"
        "Backups run nightly at two, e.g. for the orders database. A restore takes an\n"
        "hour. " + "Then the checks run, one per table, and each writes its report. " * 6 + "\n"
    )
    [snippet] = _snippets(tmp_path, "restore")
    # From the sentence of the hit (not the line's start), whole sentences up to the
    # limit: the cut falls after a full stop, never inside a word.
    assert snippet.startswith("A restore takes an hour. Then the checks run")
    assert snippet.endswith("writes its report.") and "…" not in snippet
    assert len(snippet) <= docs_module.SNIPPET_CHARS
    # "e.g." and a list's "1." end no sentence.
    [backups] = _snippets(tmp_path, "nightly")
    assert backups.startswith("Backups run nightly at two, e.g. for the orders database. A")


def test_a_heading_brings_the_whole_sentences_below_it(tmp_path: Path) -> None:
    (tmp_path / "ops.md").write_text(
        "## Restarts and crashes\n"
        "\n"
        "1. A process that dies loses its threads at once. " + "More words follow here. " * 20
    )
    [snippet] = _snippets(tmp_path, "crashes")
    head, body = snippet.split("\n")
    assert head == "## Restarts and crashes"
    assert body.startswith("1. A process that dies loses its threads at once. More")
    assert body.endswith("here.") and len(snippet) <= docs_module.SNIPPET_CHARS


def test_one_sentence_too_long_is_cut_after_a_whole_word(tmp_path: Path) -> None:
    (tmp_path / "ops.md").write_text("The refund " + "procedure " * 60 + "ends here.\n")
    [snippet] = _snippets(tmp_path, "refund")
    assert snippet.endswith(" procedure…") and len(snippet) <= docs_module.SNIPPET_CHARS


def test_the_runbook_s_crash_answer_is_the_takeover_sentence_uncut() -> None:
    """`@opsloop look up crash` against the shipped runbook: whole sentences, and the
    first says what happens to a dead process's threads."""
    root = Path(__file__).resolve().parents[2] / "docs"
    [first, *_] = _snippets(root, "crash")
    assert first.startswith("## Restarts and crashes\nA process that dies loses its threads")
    raw = (root / "operations.md").read_text(encoding="utf-8")
    text, lines = " ".join(raw.split()), {line.strip() for line in raw.splitlines()}
    for query in ("crash", "rollback quorum", "metrics", "reconcile", "stuck thread"):
        for snippet in _snippets(root, query):
            body = " ".join(snippet.splitlines()[-1].split())
            words = body.removesuffix("…")
            at = text.index(words)  # the runbook's own text, in one piece
            after = text[at + len(words) : at + len(words) + 1]
            assert after in ("", " "), f"cut mid-word: {snippet!r}"
            if words == body:  # not cut: it ends a sentence, or is a whole line
                assert re.search(r"[.!?:][)`*\"]*$", body) or body in lines, snippet
