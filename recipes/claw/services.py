"""The Claw services: calendar, mail, contacts, task list and files behind one small loopback HTTP server.

Standard library only: it runs inside the episode's sandbox with whatever interpreter the harness has. The state of
one episode lives in the working copy (``WORKDIR``, the sandbox's current directory):

- ``.claw/seed.json``: the task's initial state (written by the generator into the workspace);
- ``.claw/state.json``: the current state, written atomically after every change (the grader reads it once the
  harness has exited; absent means nothing changed);
- ``files/``: the files service's tree, real files in the working copy.

The state document::

    {"now": "2026-03-02T09:00", "user": {"name": ..., "email": ...}, "counters": {"ev": 7, ...},
     "events": [{"id", "title", "start", "end", "attendees", "location", "notes"}],
     "messages": [{"id", "folder", "from", "from_name", "to", "cc", "subject", "body", "date", "labels", "read",
                   "in_reply_to"}],
     "contacts": [{"id", "name", "email", "phone", "company", "title"}],
     "tasks": [{"id", "title", "due", "done", "notes"}]}

Times are local ``YYYY-MM-DDTHH:MM`` strings, dates ``YYYY-MM-DD``. The JSON REST API (``ROUTES`` lists it):

=======================================  =============================================================
``GET /world``                           the current time and the user
``GET/POST /calendar/events``            list (``date`` or ``start``/``end``) / create an event
``GET/PATCH/DELETE /calendar/events/ID`` one event
``GET /mail/messages``                   summaries (``folder``, ``query``, ``label``, ``unread_only``)
``GET/PATCH/DELETE /mail/messages/ID``   one message; PATCH moves (``folder``) and labels; DELETE -> trash
``POST /mail/messages/ID/reply``         reply to a message (``body``, ``reply_all``)
``POST /mail/send``                      send a new message
``GET/POST /contacts``                   search (``query``) / create a contact (emails are unique)
``GET/PATCH/DELETE /contacts/ID``        one contact
``GET/POST /tasks``                      list (``status``: open, done, all) / create a task
``GET/PATCH/DELETE /tasks/ID``           one task
``GET/DELETE /files``                    list a directory (``path``) / delete a file
``GET/PUT /files/content``               read / write a file (``path``, ``content``)
``POST /files/move``                     move or rename a file (``src``, ``dst``)
=======================================  =============================================================

Errors are ``{"error": message}`` with status 400 (bad input), 404 (no such record or route) or 409 (conflict).

Run: ``python -m recipes.claw.services --workdir . [--port 0]``; the first stdout line is
``{"event": "listening", "url": "http://127.0.0.1:PORT"}``. Only loopback addresses may be bound.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

CLAW_DIR = ".claw"
SEED_FILE = f"{CLAW_DIR}/seed.json"
STATE_FILE = f"{CLAW_DIR}/state.json"
FILES_ROOT = "files"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
COLLECTIONS = ("events", "messages", "contacts", "tasks")
ID_PREFIX = {"events": "ev", "messages": "m", "contacts": "c", "tasks": "t"}
FOLDERS = frozenset({"inbox", "archive", "trash", "sent"})
MAX_BODY_BYTES = 1_000_000
MAX_FILE_BYTES = 200_000
TIME_FORMAT = "%Y-%m-%dT%H:%M"

JSON = dict[str, Any]


class ServiceError(Exception):
    """A request the services refuse: its HTTP status and a message naming the bad field or value."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


# ---------------------------------------------------------------------------------------------------- values
def parse_time(value: Any, field: str) -> datetime:
    """``value`` as a local time (``YYYY-MM-DDTHH:MM``, seconds allowed); 400 naming ``field`` otherwise."""
    if not isinstance(value, str):
        raise ServiceError(400, f"{field} must be a time string YYYY-MM-DDTHH:MM, got {value!r}")
    try:
        return datetime.fromisoformat(value).replace(tzinfo=None, second=0, microsecond=0)
    except ValueError:
        raise ServiceError(400, f"{field} must be a time YYYY-MM-DDTHH:MM, got {value!r}") from None


def format_time(moment: datetime) -> str:
    """The canonical text of a time."""
    return moment.strftime(TIME_FORMAT)


def parse_date(value: Any, field: str) -> str:
    """``value`` as a canonical ``YYYY-MM-DD`` date; 400 naming ``field`` otherwise."""
    try:
        return date.fromisoformat(str(value)[:10]).isoformat() if isinstance(value, str) else _bad_date(field, value)
    except ValueError:
        return _bad_date(field, value)


def _bad_date(field: str, value: Any) -> str:
    raise ServiceError(400, f"{field} must be a date YYYY-MM-DD, got {value!r}")


def _text(body: JSON, field: str, *, required: bool = False, default: str = "") -> str:
    value = body.get(field, None)
    if value is None:
        if required:
            raise ServiceError(400, f"{field} is required")
        return default
    if not isinstance(value, str):
        raise ServiceError(400, f"{field} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise ServiceError(400, f"{field} must not be empty")
    return value


def _emails(value: Any, field: str) -> list[str]:
    """A list of addresses from a list or a comma-separated string."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ServiceError(400, f"{field} must be a list of email addresses")
    out = [item.strip() for item in items if item.strip()]
    for item in out:
        if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", item):
            raise ServiceError(400, f"{field}: {item!r} is not an email address")
    return out


def _flag(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ServiceError(400, f"{field} must be true or false, got {value!r}")


def _labels(value: Any, field: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) and item.strip() for item in items):
        raise ServiceError(400, f"{field} must be a list of non-empty strings")
    return [item.strip() for item in items]


# ---------------------------------------------------------------------------------------------------- state
class ClawState:
    """The services' state for one working copy: records in memory, saved to ``.claw/state.json`` on change."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()
        state_path, seed_path = self.workdir / STATE_FILE, self.workdir / SEED_FILE
        source = state_path if state_path.is_file() else seed_path
        if not source.is_file():
            raise FileNotFoundError(f"no {SEED_FILE} in {self.workdir}: not a Claw task's working copy")
        self.data: JSON = json.loads(source.read_text(encoding="utf-8"))
        for name in COLLECTIONS:
            self.data.setdefault(name, [])
        self.data.setdefault("counters", {})
        self.lock = threading.Lock()
        (self.workdir / FILES_ROOT).mkdir(exist_ok=True)

    def save(self) -> None:
        """Write the state atomically (a reader never sees half a file)."""
        path = self.workdir / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(temporary, path)

    def new_id(self, collection: str) -> str:
        """The next id of ``collection`` (``ev-8``): never reuses one, also after deletions."""
        prefix = ID_PREFIX[collection]
        taken = {record["id"] for record in self.data[collection]}
        number = int(self.data["counters"].get(prefix, len(self.data[collection])))
        while True:
            number += 1
            candidate = f"{prefix}-{number}"
            if candidate not in taken:
                self.data["counters"][prefix] = number
                return candidate

    def find(self, collection: str, record_id: str) -> JSON:
        """The record ``record_id`` of ``collection``; 404 otherwise."""
        for record in self.data[collection]:
            if record["id"] == record_id:
                return record  # type: ignore[no-any-return]
        raise ServiceError(404, f"no {collection[:-1]} with id {record_id!r}")

    def remove(self, collection: str, record_id: str) -> JSON:
        """Remove and return a record; 404 if absent."""
        record = self.find(collection, record_id)
        self.data[collection].remove(record)
        return record

    def files_path(self, relative: Any, field: str = "path", *, allow_root: bool = False) -> Path:
        """A path under ``files/`` from a relative path (a leading ``files/`` is accepted); 400 if it escapes."""
        if not isinstance(relative, str):
            raise ServiceError(400, f"{field} must be a string path")
        text = relative.strip().strip("/")
        if text == FILES_ROOT or text.startswith(FILES_ROOT + "/"):
            text = text[len(FILES_ROOT) :].lstrip("/")
        parts = [part for part in text.split("/") if part not in ("", ".")]
        if any(part == ".." for part in parts) or "\0" in text:
            raise ServiceError(400, f"{field} {relative!r} leaves the files root")
        if not parts and not allow_root:
            raise ServiceError(400, f"{field} must name a file")
        root = self.workdir / FILES_ROOT
        path = root.joinpath(*parts)
        current = root
        for part in parts:  # no symbolic link may lead out of the tree
            current = current / part
            if current.is_symlink():
                raise ServiceError(400, f"{field} {relative!r} passes through a symbolic link")
        return path

    def relative(self, path: Path) -> str:
        """A files-service path as the API shows it (relative to ``files/``)."""
        return path.relative_to(self.workdir / FILES_ROOT).as_posix()


# ---------------------------------------------------------------------------------------------------- handlers
Handler = Callable[[ClawState, dict[str, str], JSON], tuple[int, Any]]


def world(state: ClawState, _: dict[str, str], __: JSON) -> tuple[int, Any]:
    """The current time and the user."""
    return 200, {"now": state.data.get("now"), "user": state.data.get("user", {})}


def list_events(state: ClawState, _: dict[str, str], args: JSON) -> tuple[int, Any]:
    """Events overlapping ``date`` (a day) or [``start``, ``end``), sorted by start."""
    events = state.data["events"]
    if args.get("date"):
        day = datetime.fromisoformat(parse_date(args["date"], "date"))
        lo, hi = day, day + timedelta(days=1)
    else:
        lo = parse_time(args["start"], "start") if args.get("start") else datetime.min
        hi = parse_time(args["end"], "end") if args.get("end") else datetime.max
    chosen = [e for e in events if parse_time(e["start"], "start") < hi and parse_time(e["end"], "end") > lo]
    return 200, {"events": sorted(chosen, key=lambda e: (e["start"], e["id"]))}


def _event_times(body: JSON, start_default: str | None, end_default: str | None) -> tuple[str, str]:
    start = parse_time(body.get("start", start_default), "start")
    if body.get("duration_minutes") is not None:
        minutes = body["duration_minutes"]
        if not isinstance(minutes, int) or isinstance(minutes, bool) or not 0 < minutes <= 24 * 60:
            raise ServiceError(400, f"duration_minutes must be a whole number in 1..1440, got {minutes!r}")
        end = start + timedelta(minutes=minutes)
    elif body.get("end") is not None or end_default is not None:
        end = parse_time(body.get("end", end_default), "end")
    else:
        raise ServiceError(400, "end or duration_minutes is required")
    if end <= start:
        raise ServiceError(400, f"end {format_time(end)} must be after start {format_time(start)}")
    return format_time(start), format_time(end)


def create_event(state: ClawState, _: dict[str, str], body: JSON) -> tuple[int, Any]:
    """A new event (conflicts are the caller's business, as in any calendar)."""
    start, end = _event_times(body, None, None)
    event = {
        "id": state.new_id("events"),
        "title": _text(body, "title", required=True).strip(),
        "start": start,
        "end": end,
        "attendees": _emails(body.get("attendees"), "attendees"),
        "location": _text(body, "location"),
        "notes": _text(body, "notes"),
    }
    state.data["events"].append(event)
    return 201, event


def update_event(state: ClawState, params: dict[str, str], body: JSON) -> tuple[int, Any]:
    """Change an event's fields (``start`` alone keeps the duration)."""
    event = state.find("events", params["event_id"])
    updated = dict(event)
    if any(body.get(key) is not None for key in ("start", "end", "duration_minutes")):
        old = parse_time(event["end"], "end") - parse_time(event["start"], "start")
        if body.get("start") is not None and body.get("end") is None and body.get("duration_minutes") is None:
            body = {**body, "duration_minutes": int(old.total_seconds() // 60)}
        updated["start"], updated["end"] = _event_times(body, event["start"], event["end"])
    for key in ("title", "location", "notes"):
        if body.get(key) is not None:
            updated[key] = _text(body, key, required=key == "title")
    if body.get("attendees") is not None:
        updated["attendees"] = _emails(body["attendees"], "attendees")
    event.update(updated)
    return 200, event


def delete_event(state: ClawState, params: dict[str, str], _: JSON) -> tuple[int, Any]:
    """Remove an event."""
    return 200, {"deleted": state.remove("events", params["event_id"])["id"]}


def get_event(state: ClawState, params: dict[str, str], _: JSON) -> tuple[int, Any]:
    """One event."""
    return 200, state.find("events", params["event_id"])


def _summary(message: JSON) -> JSON:
    keys = ("id", "folder", "from", "from_name", "to", "subject", "date", "labels", "read")
    return {key: message.get(key) for key in keys}


def list_messages(state: ClawState, _: dict[str, str], args: JSON) -> tuple[int, Any]:
    """Message summaries of a folder (default inbox; ``all`` for every folder), newest first."""
    folder = args.get("folder") or "inbox"
    if folder != "all" and folder not in FOLDERS:
        raise ServiceError(400, f"folder must be one of {sorted(FOLDERS)} or all, got {folder!r}")
    query = str(args.get("query") or "").casefold()
    label = args.get("label")
    unread = _flag(args["unread_only"], "unread_only") if args.get("unread_only") is not None else False
    chosen = []
    for message in state.data["messages"]:
        text = " ".join([message["from"], message.get("from_name", ""), message["subject"], message["body"]])
        if (
            (folder == "all" or message["folder"] == folder)
            and (not query or query in text.casefold())
            and (not label or label in message["labels"])
            and (not unread or not message["read"])
        ):
            chosen.append(_summary(message))
    return 200, {"messages": sorted(chosen, key=lambda m: (m["date"], m["id"]), reverse=True)}


def get_message(state: ClawState, params: dict[str, str], _: JSON) -> tuple[int, Any]:
    """One message, in full (reading does not mark it read: ``PATCH read`` does)."""
    return 200, state.find("messages", params["message_id"])


def update_message(state: ClawState, params: dict[str, str], body: JSON) -> tuple[int, Any]:
    """Move a message (``folder``), add or remove labels, mark it read or unread."""
    message = state.find("messages", params["message_id"])
    updated = copy.deepcopy(message)
    if body.get("folder") is not None:
        if body["folder"] not in FOLDERS - {"sent"}:
            raise ServiceError(400, f"folder must be one of inbox, archive, trash, got {body['folder']!r}")
        updated["folder"] = body["folder"]
    for label in _labels(body["add_labels"], "add_labels") if body.get("add_labels") is not None else []:
        if label not in updated["labels"]:
            updated["labels"].append(label)
    if body.get("remove_labels") is not None:
        gone = set(_labels(body["remove_labels"], "remove_labels"))
        updated["labels"] = [label for label in updated["labels"] if label not in gone]
    if body.get("read") is not None:
        updated["read"] = _flag(body["read"], "read")
    message.update(updated)
    return 200, message


def delete_message(state: ClawState, params: dict[str, str], _: JSON) -> tuple[int, Any]:
    """Move a message to the trash; one already there is deleted for good."""
    message = state.find("messages", params["message_id"])
    if message["folder"] == "trash":
        state.remove("messages", message["id"])
        return 200, {"deleted": message["id"]}
    message["folder"] = "trash"
    return 200, {"trashed": message["id"]}


def _sent(state: ClawState, to: list[str], cc: list[str], subject: str, body: str, reply_to: str | None) -> JSON:
    user = state.data.get("user", {})
    if not to:
        raise ServiceError(400, "to must name at least one recipient")
    message = {
        "id": state.new_id("messages"),
        "folder": "sent",
        "from": user.get("email", ""),
        "from_name": user.get("name", ""),
        "to": to,
        "cc": cc,
        "subject": subject,
        "body": body,
        "date": state.data.get("now", ""),
        "labels": [],
        "read": True,
        "in_reply_to": reply_to,
    }
    state.data["messages"].append(message)
    return message


def send_message(state: ClawState, _: dict[str, str], body: JSON) -> tuple[int, Any]:
    """Send a new message (it lands in ``sent``)."""
    to, cc = _emails(body.get("to"), "to"), _emails(body.get("cc"), "cc")
    return 201, _sent(state, to, cc, _text(body, "subject", required=True), _text(body, "body", required=True), None)


def reply_message(state: ClawState, params: dict[str, str], body: JSON) -> tuple[int, Any]:
    """Reply to a message: to its sender (and, with ``reply_all``, its other recipients), subject ``Re: ...``."""
    original = state.find("messages", params["message_id"])
    me = state.data.get("user", {}).get("email", "")
    to = [original["from"]] if original["from"] != me else list(original["to"])
    cc: list[str] = []
    if body.get("reply_all") is not None and _flag(body["reply_all"], "reply_all"):
        cc = [a for a in [*original["to"], *original.get("cc", [])] if a != me and a not in to]
    subject = original["subject"] if original["subject"].lower().startswith("re:") else f"Re: {original['subject']}"
    return 201, _sent(state, to, cc, subject, _text(body, "body", required=True), original["id"])


def _contact_fields(body: JSON, contact: JSON) -> JSON:
    updated = dict(contact)
    for key in ("name", "phone", "company", "title"):
        if body.get(key) is not None:
            updated[key] = _text(body, key, required=key == "name").strip()
    if body.get("email") is not None:
        [updated["email"]] = _emails([_text(body, "email")], "email")
    return updated


def search_contacts(state: ClawState, _: dict[str, str], args: JSON) -> tuple[int, Any]:
    """Contacts whose name, email or company contains ``query`` (all without one), by name."""
    query = str(args.get("query") or "").casefold()
    chosen = [
        c
        for c in state.data["contacts"]
        if not query or query in " ".join([c["name"], c["email"], c.get("company", "")]).casefold()
    ]
    return 200, {"contacts": sorted(chosen, key=lambda c: (c["name"], c["id"]))}


def _unique_email(state: ClawState, email: str, own_id: str | None) -> None:
    for other in state.data["contacts"]:
        if other["email"].casefold() == email.casefold() and other["id"] != own_id:
            raise ServiceError(409, f"contact {other['id']} already has the email {email!r}")


def create_contact(state: ClawState, _: dict[str, str], body: JSON) -> tuple[int, Any]:
    """A new contact; 409 if the email is taken."""
    if body.get("email") is None:
        raise ServiceError(400, "email is required")
    template = {"id": "", "name": "", "email": "", "phone": "", "company": "", "title": ""}
    contact = _contact_fields({**body, "name": body.get("name", "")}, template)
    if not contact["name"]:
        raise ServiceError(400, "name is required")
    _unique_email(state, contact["email"], None)
    contact["id"] = state.new_id("contacts")
    state.data["contacts"].append(contact)
    return 201, contact


def update_contact(state: ClawState, params: dict[str, str], body: JSON) -> tuple[int, Any]:
    """Change a contact's fields."""
    contact = state.find("contacts", params["contact_id"])
    updated = _contact_fields(body, contact)
    _unique_email(state, updated["email"], contact["id"])
    contact.update(updated)
    return 200, contact


def get_contact(state: ClawState, params: dict[str, str], _: JSON) -> tuple[int, Any]:
    """One contact."""
    return 200, state.find("contacts", params["contact_id"])


def delete_contact(state: ClawState, params: dict[str, str], _: JSON) -> tuple[int, Any]:
    """Remove a contact."""
    return 200, {"deleted": state.remove("contacts", params["contact_id"])["id"]}


def list_tasks(state: ClawState, _: dict[str, str], args: JSON) -> tuple[int, Any]:
    """Tasks by ``status`` (open by default, done, all), by due date."""
    status = args.get("status") or "open"
    if status not in ("open", "done", "all"):
        raise ServiceError(400, f"status must be open, done or all, got {status!r}")
    chosen = [t for t in state.data["tasks"] if status == "all" or t["done"] == (status == "done")]
    return 200, {"tasks": sorted(chosen, key=lambda t: (t["due"] or "9999", t["id"]))}


def create_task(state: ClawState, _: dict[str, str], body: JSON) -> tuple[int, Any]:
    """A new open task."""
    task = {
        "id": state.new_id("tasks"),
        "title": _text(body, "title", required=True).strip(),
        "due": parse_date(body["due"], "due") if body.get("due") else None,
        "done": False,
        "notes": _text(body, "notes"),
    }
    state.data["tasks"].append(task)
    return 201, task


def update_task(state: ClawState, params: dict[str, str], body: JSON) -> tuple[int, Any]:
    """Change a task (``done: true`` completes it)."""
    task = state.find("tasks", params["task_id"])
    updated = dict(task)
    if body.get("title") is not None:
        updated["title"] = _text(body, "title", required=True).strip()
    if body.get("notes") is not None:
        updated["notes"] = _text(body, "notes")
    if "due" in body:
        updated["due"] = parse_date(body["due"], "due") if body["due"] else None
    if body.get("done") is not None:
        updated["done"] = _flag(body["done"], "done")
    task.update(updated)
    return 200, task


def get_task(state: ClawState, params: dict[str, str], _: JSON) -> tuple[int, Any]:
    """One task."""
    return 200, state.find("tasks", params["task_id"])


def delete_task(state: ClawState, params: dict[str, str], _: JSON) -> tuple[int, Any]:
    """Remove a task."""
    return 200, {"deleted": state.remove("tasks", params["task_id"])["id"]}


def list_files(state: ClawState, _: dict[str, str], args: JSON) -> tuple[int, Any]:
    """Every file under ``path`` (default: the whole tree), with sizes."""
    directory = state.files_path(args.get("path") or "", allow_root=True)
    if not directory.is_dir():
        raise ServiceError(404, f"no directory {args.get('path')!r}")
    entries = [
        {"path": state.relative(path), "size": path.stat().st_size}
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.is_symlink()
    ]
    return 200, {"files": entries}


def read_file(state: ClawState, _: dict[str, str], args: JSON) -> tuple[int, Any]:
    """A text file's content."""
    path = state.files_path(args.get("path"))
    if not path.is_file():
        raise ServiceError(404, f"no file {args.get('path')!r}")
    return 200, {"path": state.relative(path), "content": path.read_text(encoding="utf-8", errors="replace")}


def write_file(state: ClawState, _: dict[str, str], body: JSON) -> tuple[int, Any]:
    """Create or replace a text file (parent directories are created)."""
    path = state.files_path(body.get("path"))
    content = _text(body, "content")
    if len(content.encode()) > MAX_FILE_BYTES:
        raise ServiceError(400, f"content is larger than {MAX_FILE_BYTES} bytes")
    if path.is_dir():
        raise ServiceError(409, f"{body.get('path')!r} is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return 200, {"path": state.relative(path), "size": path.stat().st_size}


def move_file(state: ClawState, _: dict[str, str], body: JSON) -> tuple[int, Any]:
    """Move or rename a file; 409 if the destination exists."""
    source, target = state.files_path(body.get("src"), "src"), state.files_path(body.get("dst"), "dst")
    if not source.is_file():
        raise ServiceError(404, f"no file {body.get('src')!r}")
    if target.exists():
        raise ServiceError(409, f"{body.get('dst')!r} already exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)
    return 200, {"src": state.relative(source), "dst": state.relative(target)}


def delete_file(state: ClawState, _: dict[str, str], args: JSON) -> tuple[int, Any]:
    """Delete a file."""
    path = state.files_path(args.get("path"))
    if not path.is_file():
        raise ServiceError(404, f"no file {args.get('path')!r}")
    path.unlink()
    return 200, {"deleted": state.relative(path)}


ROUTES: list[tuple[str, re.Pattern[str], Handler]] = [
    (method, re.compile(pattern), handler)
    for method, pattern, handler in [
        ("GET", r"/world", world),
        ("GET", r"/calendar/events", list_events),
        ("POST", r"/calendar/events", create_event),
        ("GET", r"/calendar/events/(?P<event_id>[^/]+)", get_event),
        ("PATCH", r"/calendar/events/(?P<event_id>[^/]+)", update_event),
        ("DELETE", r"/calendar/events/(?P<event_id>[^/]+)", delete_event),
        ("GET", r"/mail/messages", list_messages),
        ("POST", r"/mail/send", send_message),
        ("GET", r"/mail/messages/(?P<message_id>[^/]+)", get_message),
        ("PATCH", r"/mail/messages/(?P<message_id>[^/]+)", update_message),
        ("DELETE", r"/mail/messages/(?P<message_id>[^/]+)", delete_message),
        ("POST", r"/mail/messages/(?P<message_id>[^/]+)/reply", reply_message),
        ("GET", r"/contacts", search_contacts),
        ("POST", r"/contacts", create_contact),
        ("GET", r"/contacts/(?P<contact_id>[^/]+)", get_contact),
        ("PATCH", r"/contacts/(?P<contact_id>[^/]+)", update_contact),
        ("DELETE", r"/contacts/(?P<contact_id>[^/]+)", delete_contact),
        ("GET", r"/tasks", list_tasks),
        ("POST", r"/tasks", create_task),
        ("GET", r"/tasks/(?P<task_id>[^/]+)", get_task),
        ("PATCH", r"/tasks/(?P<task_id>[^/]+)", update_task),
        ("DELETE", r"/tasks/(?P<task_id>[^/]+)", delete_task),
        ("GET", r"/files", list_files),
        ("DELETE", r"/files", delete_file),
        ("GET", r"/files/content", read_file),
        ("PUT", r"/files/content", write_file),
        ("POST", r"/files/move", move_file),
    ]
]
"""(method, path pattern, handler): the whole API."""
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def dispatch(state: ClawState, method: str, path: str, args: JSON) -> tuple[int, Any]:
    """Answer one request (``args``: the query for GET/DELETE, the JSON body otherwise); saves after a change."""
    allowed = []
    for route_method, pattern, handler in ROUTES:
        match = pattern.fullmatch(path.rstrip("/") or "/")
        if match is None:
            continue
        allowed.append(route_method)
        if route_method != method:
            continue
        with state.lock:
            before = json.dumps(state.data, sort_keys=True) if method in MUTATING else ""
            try:
                status, payload = handler(state, match.groupdict(), args)
            except ServiceError:
                state.data = json.loads(before) if before else state.data  # a refused request changes nothing
                raise
            if method in MUTATING and json.dumps(state.data, sort_keys=True) != before:
                state.save()
            return status, payload
    if allowed:
        raise ServiceError(405, f"{method} not allowed on {path}; allowed: {', '.join(sorted(set(allowed)))}")
    raise ServiceError(404, f"no route {method} {path}")


# ---------------------------------------------------------------------------------------------------- server
class _RequestHandler(BaseHTTPRequestHandler):
    server: ClawHTTPServer
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        url = urlsplit(self.path)
        try:
            args = self._arguments(url.query)
            status, payload = dispatch(self.server.state, self.command, url.path, args)
        except ServiceError as exc:
            status, payload = exc.status, {"error": exc.message}
        except Exception as exc:  # noqa: BLE001 - the agent sees a 500 naming the failure, the server lives on
            status, payload = 500, {"error": f"internal error: {exc!r}"}
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _arguments(self, query: str) -> JSON:
        args: JSON = {key: values[-1] for key, values in parse_qs(query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise ServiceError(400, f"request body larger than {MAX_BODY_BYTES} bytes")
        if length:
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError as exc:
                raise ServiceError(400, f"request body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise ServiceError(400, "request body must be a JSON object")
            args.update(body)
        return args

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: the agent's trajectory records every call."""


class ClawHTTPServer(ThreadingHTTPServer):
    """The services' HTTP server over one ``ClawState``."""

    daemon_threads = True

    def __init__(self, state: ClawState, host: str = "127.0.0.1", port: int = 0) -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"the Claw services bind loopback only, got host {host!r}")
        self.state = state
        super().__init__((host, port), _RequestHandler)

    @property
    def url(self) -> str:
        """The base URL (``http://127.0.0.1:PORT``)."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class BackgroundServices:
    """The services served from a thread of this process (tests, the MCP server's own copy)."""

    def __init__(self, workdir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = ClawHTTPServer(ClawState(workdir), host, port)
        # a short poll interval: ``close`` (``shutdown``) waits for the serving loop to look up
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, name="claw-services", daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        """The base URL."""
        return self.server.url

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> BackgroundServices:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: serve the working copy's services until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m recipes.claw.services", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="The working copy (holds .claw/seed.json).")
    parser.add_argument("--host", default="127.0.0.1", help="A loopback address.")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed on the first line).")
    args = parser.parse_args(argv)
    server = ClawHTTPServer(ClawState(args.workdir), args.host, args.port)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    sys.stdout.write(json.dumps({"event": "listening", "url": server.url}) + "\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
