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


def _snippet(lines: list[str], i: int) -> str:
    """The hit line plus a little context, trimmed to ~SNIPPET_CHARS."""
    start = i - 1 if i > 0 and not lines[i].lstrip().startswith("#") else i
    text = "\n".join(ln.rstrip() for ln in lines[start : i + 3]).strip()
    if len(text) > SNIPPET_CHARS:
        text = text[: SNIPPET_CHARS - 1].rstrip() + "…"
    return text


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
    hits: list[tuple[float, str, int, str]] = []
    for path in _markdown_files(root):
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        rel = path.relative_to(root).as_posix()
        for i, line in enumerate(lines):
            score = score_line(line, terms)
            if score > 0:
                hits.append((score, rel, i + 1, _snippet(lines, i)))
    hits.sort(key=lambda h: (-h[0], h[1], h[2]))
    out["results"] = [
        {"file": f, "line": n, "snippet": s, "score": sc} for sc, f, n, s in hits[:limit]
    ]
    return out


@tool(policy="run_now")
async def search_docs(args: SearchDocsArgs, ctx: ToolContext) -> dict:
    """Search the team's Markdown documentation for the given words.

    Returns the best-matching lines (file, 1-based line number, snippet, score),
    best first. Use it to look up runbooks, policies and how-tos before acting.
    """
    return await asyncio.to_thread(search, docs_dir(), args.query, args.limit)
