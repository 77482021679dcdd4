"""The docs site: an index of pages, full-text search with snippets, and the pages.

State (``state["docs"]``): ``product`` (its name) and ``pages`` (slug, title, ``body``: a list of paragraphs).
Read-only: the docs tasks are graded on the submitted answer.
"""

from __future__ import annotations

import re
from typing import Any

from recipes.gui.apps.core import AppRouter, Request, Response, State, esc, page

SNIPPET_CHARS = 160


def search(docs: dict[str, Any], query: str) -> list[tuple[dict[str, Any], str]]:
    """Pages containing every word of ``query`` (case-insensitive), most occurrences first, with a snippet."""
    words = [w for w in re.findall(r"[\w.-]+", query.lower()) if w]
    hits = []
    for doc in docs["pages"]:
        text = " ".join([doc["title"], *doc["body"]])
        lower = text.lower()
        if not words or not all(word in lower for word in words):
            continue
        at = lower.find(words[0])
        start = max(0, at - SNIPPET_CHARS // 3)
        hits.append((sum(lower.count(w) for w in words), doc, text[start : start + SNIPPET_CHARS]))
    hits.sort(key=lambda hit: (-hit[0], hit[1]["title"]))
    return [(doc, snippet) for _, doc, snippet in hits]


def _search_form(query: str) -> str:
    return (
        '<form method="get" action="/docs/search" role="search" aria-label="Search docs"><label>Search docs '
        f'<input name="q" value="{esc(query)}"></label> <button type="submit">Search</button></form>'
    )


def index_page(state: State, request: Request, _: re.Match[str]) -> Response:
    """The search form and every page's title."""
    docs = state["docs"]
    links = "".join(f'<li><a href="/docs/page/{esc(d["slug"])}">{esc(d["title"])}</a></li>' for d in docs["pages"])
    body = f"<h1>{esc(docs['product'])} documentation</h1>{_search_form('')}<h2>Pages</h2><ul>{links}</ul>"
    return Response(200, page("Docs", body, state))


def search_page(state: State, request: Request, _: re.Match[str]) -> Response:
    """Search results."""
    query = request.arg("q")
    hits = search(state["docs"], query) if query else []
    items = "".join(
        f'<li><a href="/docs/page/{esc(d["slug"])}">{esc(d["title"])}</a><p>...{esc(snippet)}...</p></li>'
        for d, snippet in hits
    )
    results = f"<p>{len(hits)} results for {esc(query)}</p><ol>{items}</ol>" if query else ""
    return Response(200, page("Search", f"<h1>Search</h1>{_search_form(query)}{results}", state))


def doc_page(state: State, request: Request, match: re.Match[str]) -> Response:
    """One page."""
    doc = next((d for d in state["docs"]["pages"] if d["slug"] == match["slug"]), None)
    if doc is None:
        return Response(404, page("Not found", "<p>No such page.</p>", state))
    paragraphs = "".join(f"<p>{esc(text)}</p>" for text in doc["body"])
    body = f'<h1>{esc(doc["title"])}</h1>{paragraphs}<a href="/docs">Index</a>'
    return Response(200, page(doc["title"], body, state))


def register(router: AppRouter) -> None:
    """Add the docs site's routes."""
    router.add("GET", r"/docs", index_page)
    router.add("GET", r"/docs/search", search_page)
    router.add("GET", r"/docs/page/(?P<slug>[\w-]+)", doc_page)
