"""search_docs: deterministic keyword search over a folder of Markdown files."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tools.context import ToolContext
from tools.registry import tool

DEFAULT_DOCS_DIR = "./docs"
MAX_FILE_BYTES = 2_000_000
SNIPPET_CHARS = 300
HEADING_BONUS = 1.0  # extra score per matched term on a heading line
_WORD = re.compile(r"\w+")
# Markdown structure, enough to find a hit's paragraph: code fences, list items, and the
# lines that stand alone (headings, quotes, table rows).
_FENCE = re.compile(r"^\s*(?:```|~~~)")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
_ONE_LINE = ("#", ">", "|")
# A sentence ends at . ! or ? (with any closing bracket, quote or emphasis) before a space.
_SENTENCE_END = re.compile(r"[.!?][)\]\"'”’*_`]*(?=\s|$)")
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "cf"})


class SearchDocsArgs(BaseModel):
    """Arguments for search_docs."""

    model_config = ConfigDict(str_strip_whitespace=True)

    query: str = Field(min_length=1, description="Words to look for.")
    limit: int = Field(default=5, ge=1, le=20, description="Maximum results.")


_docs_dir = Path(DEFAULT_DOCS_DIR)


def configure(settings: Any) -> None:
    """Take the docs folder from the tool settings (``OPSLOOP_DOCS_DIR``)."""
    global _docs_dir
    _docs_dir = Path(settings.docs_dir or DEFAULT_DOCS_DIR)


def docs_dir() -> Path:
    """The docs folder: the configured one, else ``./docs``."""
    return _docs_dir


def query_terms(query: str) -> list[str]:
    """Distinct lower-cased words of the query, in order."""
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))


def score_line(line: str, terms: list[str]) -> float:
    """Term frequency (prefix match, so 'refund' hits 'refunds'), plus a
    bonus per matched term on headings and for covering more query terms."""
    words = [w.lower() for w in _WORD.findall(line)]
    hits = {t: sum(1 for w in words if w.startswith(t)) for t in terms}
    matched = sum(1 for n in hits.values() if n)
    if not matched:
        return 0.0
    score = float(sum(hits.values())) + matched / len(terms)
    if line.lstrip().startswith("#"):
        score += HEADING_BONUS * matched
    return round(score, 4)


def _blocks(lines: list[str]) -> list[range]:
    """The line ranges of the Markdown blocks: paragraphs, list items (with their
    indented continuation lines), and, one line each, headings, quotes, table rows and
    the lines of a fenced code block."""
    blocks: list[range] = []
    start: int | None = None
    fenced = False
    for n, line in enumerate(lines):
        alone = fenced or bool(_FENCE.match(line)) or line.lstrip().startswith(_ONE_LINE)
        if _FENCE.match(line):
            fenced = not fenced
        if start is not None and (alone or not line.strip() or _ITEM.match(line)):
            blocks.append(range(start, n))
            start = None
        if alone:
            blocks.append(range(n, n + 1))
        elif line.strip() and start is None:
            start = n
    if start is not None:
        blocks.append(range(start, len(lines)))
    return blocks


def _sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``text``: a sentence ends at ``.``, ``!`` or
    ``?`` before a space, unless the word it ends is an abbreviation ("e.g.") or a list
    number ("1."); the text's end ends one too."""
    spans: list[tuple[int, int]] = []
    start = 0
    for end in _SENTENCE_END.finditer(text):
        word = text[start : end.start()].rsplit(maxsplit=1)[-1:] or [""]
        stem = word[0].lstrip('(`*_"“').lower()
        if stem in _ABBREVIATIONS or len(stem) <= 1 or stem.isdigit():
            continue
        spans.append((start, end.end()))
        start = end.end()
        while start < len(text) and text[start].isspace():
            start += 1
    if text[start:].strip():
        spans.append((start, len(text)))
    return spans


def _has_term(text: str, terms: list[str]) -> bool:
    return any(w.lower().startswith(t) for w in _WORD.findall(text) for t in terms)


def _whole(sentences: list[str], room: int) -> str:
    """As many of ``sentences``, from the first and whole, as fit in ``room`` characters."""
    taken = ""
    for sentence in sentences:
        joined = f"{taken} {sentence}" if taken else sentence
        if len(joined) > room:
            break
        taken = joined
    return taken


def _fit(sentences: list[str], room: int) -> str:
    """Whole sentences within ``room``; a first sentence longer than that is cut after
    its last whole word that fits, and marked with "…"."""
    taken = _whole(sentences, room)
    if taken or not sentences:
        return taken
    head = sentences[0][: room - 1]
    words = head.rsplit(maxsplit=1)
    cut = words[0] if len(words) > 1 and not sentences[0][room - 1 : room].isspace() else head
    return cut.rstrip() + "…"


def _snippet(lines: list[str], blocks: list[range], i: int, terms: list[str]) -> str:
    """The hit's sentence and the ones after it in its paragraph, as many as fit in
    SNIPPET_CHARS; a heading brings the whole sentences that fit from the paragraph
    below it. Only a single sentence too long to fit is cut, and at a word."""
    at = next(n for n, b in enumerate(blocks) if i in b)
    if lines[i].lstrip().startswith("#"):
        head = _fit([lines[i].strip()], SNIPPET_CHARS)
        below = blocks[at + 1] if at + 1 < len(blocks) else None
        if below is None or lines[below[0]].lstrip().startswith("#"):
            return head
        text = " ".join(lines[n].strip() for n in below)
        body = _whole([text[a:b] for a, b in _sentences(text)], SNIPPET_CHARS - len(head) - 1)
        return f"{head}\n{body}" if body else head
    # The block as one line of text, knowing where each of its lines sits in it.
    parts = [lines[n].strip() for n in blocks[at]]
    text = " ".join(parts)
    lo = sum(len(p) + 1 for p in parts[: i - blocks[at].start])
    hi = lo + len(parts[i - blocks[at].start])
    spans = _sentences(text)
    on_line = [s for s in spans if s[0] < hi and s[1] > lo] or spans[-1:]
    first = next((s for s in on_line if _has_term(text[s[0] : s[1]], terms)), on_line[0])
    return _fit([text[a:b] for a, b in spans[spans.index(first) :]], SNIPPET_CHARS)


def _markdown_files(root: Path) -> list[Path]:
    """*.md files under root, recursively, skipping hidden folders; sorted."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(dirpath, f) for f in filenames if f.lower().endswith(".md"))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def search(root: Path, query: str, limit: int) -> dict:
    """Blocking search; run it in a thread."""
    out: dict = {"query": query, "results": []}
    if not root.is_dir():
        out["note"] = f"docs folder {str(root)!r} does not exist"
        return out
    terms = query_terms(query)
    if not terms:
        out["note"] = "query has no searchable words"
        return out
    hits: list[tuple[float, str, int]] = []
    files: dict[str, list[str]] = {}
    for path in _markdown_files(root):
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        rel = path.relative_to(root).as_posix()
        files[rel] = lines
        for i, line in enumerate(lines):
            score = score_line(line, terms)
            if score > 0:
                hits.append((score, rel, i))
    hits.sort(key=lambda h: (-h[0], h[1], h[2]))
    blocks: dict[str, list[range]] = {}  # only for the files of the hits shown
    for score, rel, i in hits[:limit]:
        if rel not in blocks:
            blocks[rel] = _blocks(files[rel])
        snippet = _snippet(files[rel], blocks[rel], i, terms)
        out["results"].append({"file": rel, "line": i + 1, "snippet": snippet, "score": score})
    return out


@tool(policy="run_now")
async def search_docs(args: SearchDocsArgs, ctx: ToolContext) -> dict:
    """Search the team's Markdown documentation for the given words.

    Returns the best-matching lines (file, 1-based line number, snippet, score),
    best first. Use it to look up runbooks, policies and how-tos before acting.
    """
    return await asyncio.to_thread(search, docs_dir(), args.query, args.limit)
