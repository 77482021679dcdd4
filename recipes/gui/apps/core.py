"""Requests, responses and routing of the apps: pure functions of (state, request), no sockets.

A handler takes the app state (one JSON-able dict, mutated in place) and a ``Request`` and returns a ``Response``.
A state-changing ``POST`` answers ``303 See Other`` to the page showing its result (post/redirect/get), so a browser
reload never repeats it. ``AppRouter.handle`` returns whether the state changed, which tells the server to persist.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

State = dict[str, Any]


@dataclass(frozen=True)
class Request:
    """One request: method, path, query and form fields (first value of each name)."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    form: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, method: str, target: str, body: bytes = b"") -> Request:
        """A request from its method, target (path and query) and urlencoded body."""
        parts = urlsplit(target)
        return cls(method.upper(), parts.path or "/", _fields(parts.query), _fields(body.decode("utf-8", "replace")))

    def arg(self, name: str, default: str = "") -> str:
        """A query field, else a form field, stripped."""
        return (self.query.get(name) or self.form.get(name) or default).strip()


def _fields(text: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(text, keep_blank_values=True).items()}


@dataclass(frozen=True)
class Response:
    """Status, HTML body and an optional redirect target."""

    status: int
    body: str = ""
    location: str | None = None
    changed: bool = False

    @classmethod
    def redirect(cls, location: str, *, changed: bool = True) -> Response:
        """A 303 to ``location`` after a state change."""
        return cls(303, "", location, changed)


Handler = Callable[[State, Request, re.Match[str]], Response]


class AppRouter:
    """Routes by method and a path regular expression."""

    def __init__(self) -> None:
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        """Serve ``method`` requests whose whole path matches ``pattern``."""
        self.routes.append((method, re.compile(pattern), handler))

    def handle(self, state: State, request: Request) -> Response:
        """The response of the first matching route; 404 or 405 otherwise."""
        allowed = False
        for method, pattern, handler in self.routes:
            match = pattern.fullmatch(request.path.rstrip("/") or "/")
            if match is None:
                continue
            if method == request.method:
                return handler(state, request, match)
            allowed = True
        if allowed:
            return Response(405, page("Not allowed", "<p>Method not allowed.</p>", state))
        return Response(404, page("Not found", f"<p>No page at {esc(request.path)}.</p>", state))


def esc(value: object) -> str:
    """HTML-escaped text."""
    return html.escape(str(value), quote=True)


def money(cents: int) -> str:
    """Cents as dollars.

    >>> money(1250)
    '$12.50'
    """
    return f"${cents // 100}.{cents % 100:02d}"


def page(title: str, body: str, state: State) -> str:
    """A whole page: the portal navigation, then ``body``."""
    cart = sum(int(line["qty"]) for line in state.get("shop", {}).get("cart", []))
    nav = (
        '<nav aria-label="Apps"><a href="/shop">Shop</a> | '
        f'<a href="/shop/cart">Cart ({cart})</a> | <a href="/booking">Booking</a> | '
        '<a href="/booking/mine">My bookings</a> | <a href="/docs">Docs</a></nav>'
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        "<style>body{font-family:sans-serif;margin:16px;max-width:980px}td,th{padding:2px 8px;text-align:left}"
        "nav{margin-bottom:12px}.error{color:#b00}</style></head>"
        f"<body>{nav}<main>{body}</main></body></html>"
    )


def errors_html(errors: list[str]) -> str:
    """The form's problems, announced to assistive technology."""
    if not errors:
        return ""
    items = "".join(f"<li>{esc(error)}</li>" for error in errors)
    return f'<div role="alert" class="error"><p>Please fix:</p><ul>{items}</ul></div>'


def options(choices: list[tuple[str, str]], selected: str) -> str:
    """``<option>`` elements of (value, label) pairs, ``selected`` marked."""
    return "".join(
        f'<option value="{esc(value)}"{" selected" if value == selected else ""}>{esc(label)}</option>'
        for value, label in choices
    )
