"""The Claw services as tools: one table of tool specs, rendered as OpenAI function tools and as MCP tools, and
executed as HTTP requests against the services' REST API (``recipes.claw.services``).

Standard library only (it runs inside sandboxes). A tool's arguments named in its path template (``{event_id}``)
fill the path; the others travel as the query string (GET, DELETE) or the JSON body (POST, PUT, PATCH). A tool call
answers ``(ok, result)``: ``ok`` is whether the service accepted it, ``result`` its JSON answer (or ``{"error": ...}``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
STRING: JSON = {"type": "string"}
TIME: JSON = {"type": "string", "description": "Local time YYYY-MM-DDTHH:MM."}
DATE: JSON = {"type": "string", "description": "Date YYYY-MM-DD."}
EMAILS: JSON = {"type": "array", "items": {"type": "string"}, "description": "Email addresses."}
LABELS: JSON = {"type": "array", "items": {"type": "string"}}
BOOLEAN: JSON = {"type": "boolean"}


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does, its JSON-schema properties, and the HTTP request it becomes."""

    name: str
    description: str
    method: str
    path: str
    properties: dict[str, JSON] = field(default_factory=dict)
    required: tuple[str, ...] = ()

    def schema(self) -> JSON:
        """The arguments' JSON schema."""
        return {"type": "object", "properties": self.properties, "required": list(self.required)}

    def openai(self) -> JSON:
        """The OpenAI function tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.schema()},
        }

    def mcp(self) -> JSON:
        """The MCP tool (``tools/list`` entry)."""
        return {"name": self.name, "description": self.description, "inputSchema": self.schema()}


def _spec(
    name: str, description: str, route: str, properties: dict[str, JSON] | None = None, *required: str
) -> ToolSpec:
    method, path = route.split(" ", 1)
    return ToolSpec(name, description, method, path, properties or {}, tuple(required))


EVENT_FIELDS: dict[str, JSON] = {
    "title": STRING,
    "start": TIME,
    "end": TIME,
    "duration_minutes": {"type": "integer", "description": "Instead of end."},
    "attendees": EMAILS,
    "location": STRING,
    "notes": STRING,
}
CONTACT_FIELDS: dict[str, JSON] = {"name": STRING, "email": STRING, "phone": STRING, "company": STRING, "title": STRING}
TASK_FIELDS: dict[str, JSON] = {"title": STRING, "due": DATE, "notes": STRING}

TOOL_SPECS: tuple[ToolSpec, ...] = (
    _spec("world_info", "The current date and time, and who the user is (name, email).", "GET /world"),
    _spec(
        "calendar_list_events",
        "List calendar events of one day (date) or overlapping [start, end), sorted by start time.",
        "GET /calendar/events",
        {"date": DATE, "start": TIME, "end": TIME},
    ),
    _spec(
        "calendar_create_event",
        "Create a calendar event. Give end or duration_minutes. It does not check for conflicts.",
        "POST /calendar/events",
        EVENT_FIELDS,
        "title",
        "start",
    ),
    _spec(
        "calendar_update_event",
        "Change fields of an event (a new start alone keeps its duration).",
        "PATCH /calendar/events/{event_id}",
        {"event_id": STRING, **EVENT_FIELDS},
        "event_id",
    ),
    _spec("calendar_delete_event", "Delete an event.", "DELETE /calendar/events/{event_id}", {"event_id": STRING}),
    _spec(
        "mail_list",
        "List message summaries (newest first) of a folder: inbox (default), archive, sent, trash or all; "
        "optionally only those containing query, carrying label, or unread.",
        "GET /mail/messages",
        {"folder": STRING, "query": STRING, "label": STRING, "unread_only": BOOLEAN},
    ),
    _spec("mail_read", "Read one message in full.", "GET /mail/messages/{message_id}", {"message_id": STRING}),
    _spec(
        "mail_send",
        "Send a new email.",
        "POST /mail/send",
        {"to": EMAILS, "cc": EMAILS, "subject": STRING, "body": STRING},
        "to",
        "subject",
        "body",
    ),
    _spec(
        "mail_reply",
        "Reply to a message (to its sender; reply_all adds the other recipients).",
        "POST /mail/messages/{message_id}/reply",
        {"message_id": STRING, "body": STRING, "reply_all": BOOLEAN},
        "message_id",
        "body",
    ),
    _spec(
        "mail_update",
        "Move a message to a folder (inbox, archive, trash), add or remove labels, or mark it read/unread.",
        "PATCH /mail/messages/{message_id}",
        {"message_id": STRING, "folder": STRING, "add_labels": LABELS, "remove_labels": LABELS, "read": BOOLEAN},
        "message_id",
    ),
    _spec(
        "mail_delete",
        "Move a message to the trash.",
        "DELETE /mail/messages/{message_id}",
        {"message_id": STRING},
        "message_id",
    ),
    _spec(
        "contacts_search",
        "Find contacts whose name, email or company contains query (all contacts without one).",
        "GET /contacts",
        {"query": STRING},
    ),
    _spec("contacts_create", "Add a contact.", "POST /contacts", CONTACT_FIELDS, "name", "email"),
    _spec(
        "contacts_update",
        "Change a contact's fields.",
        "PATCH /contacts/{contact_id}",
        {"contact_id": STRING, **CONTACT_FIELDS},
        "contact_id",
    ),
    _spec("contacts_delete", "Delete a contact.", "DELETE /contacts/{contact_id}", {"contact_id": STRING}),
    _spec(
        "tasks_list",
        "List tasks by status: open (default), done or all.",
        "GET /tasks",
        {"status": {"type": "string", "enum": ["open", "done", "all"]}},
    ),
    _spec("tasks_create", "Add a task to the task list.", "POST /tasks", TASK_FIELDS, "title"),
    _spec(
        "tasks_update",
        "Change a task; done=true completes it.",
        "PATCH /tasks/{task_id}",
        {"task_id": STRING, **TASK_FIELDS, "done": BOOLEAN},
        "task_id",
    ),
    _spec("tasks_delete", "Delete a task.", "DELETE /tasks/{task_id}", {"task_id": STRING}, "task_id"),
    _spec("files_list", "List the files under a directory (default: all files).", "GET /files", {"path": STRING}),
    _spec("files_read", "Read a text file.", "GET /files/content", {"path": STRING}, "path"),
    _spec(
        "files_write",
        "Create or overwrite a text file.",
        "PUT /files/content",
        {"path": STRING, "content": STRING},
        "path",
        "content",
    ),
    _spec("files_move", "Move or rename a file.", "POST /files/move", {"src": STRING, "dst": STRING}, "src", "dst"),
    _spec("files_delete", "Delete a file.", "DELETE /files", {"path": STRING}, "path"),
)
TOOLS_BY_NAME: dict[str, ToolSpec] = {spec.name: spec for spec in TOOL_SPECS}


def openai_tools() -> list[JSON]:
    """Every service tool as an OpenAI function tool."""
    return [spec.openai() for spec in TOOL_SPECS]


def mcp_tools() -> list[JSON]:
    """Every service tool as an MCP tool."""
    return [spec.mcp() for spec in TOOL_SPECS]


def request_for(name: str, arguments: JSON) -> tuple[str, str, JSON]:
    """The HTTP (method, path with query, JSON body) of a tool call; ``ValueError`` naming a bad tool or argument."""
    spec = TOOLS_BY_NAME.get(name)
    if spec is None:
        raise ValueError(f"unknown tool {name!r}")
    rest = dict(arguments)
    path = spec.path
    for key in [part.split("}")[0] for part in spec.path.split("{")[1:]]:
        value = rest.pop(key, None)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}: argument {key!r} is required")
        path = path.replace("{" + key + "}", urllib.parse.quote(value, safe=""))
    missing = [key for key in spec.required if key not in arguments]
    if missing:
        raise ValueError(f"{name}: missing argument(s) {', '.join(missing)}")
    if spec.method in ("GET", "DELETE"):
        query = {k: (json.dumps(v) if isinstance(v, bool) else str(v)) for k, v in rest.items() if v is not None}
        return spec.method, path + ("?" + urllib.parse.urlencode(query) if query else ""), {}
    return spec.method, path, rest


def call_tool(base_url: str, name: str, arguments: JSON, timeout_s: float = 30.0) -> tuple[bool, Any]:
    """Run one tool call against the services at ``base_url``: (accepted, the JSON answer or an error object)."""
    try:
        method, path, body = request_for(name, arguments)
    except ValueError as exc:
        return False, {"error": str(exc)}
    data = json.dumps(body).encode() if method not in ("GET", "DELETE") else None
    request = urllib.request.Request(  # noqa: S310 - a loopback http URL of our own services
        base_url.rstrip("/") + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return True, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            return False, json.loads(exc.read() or b"null")
        except ValueError:
            return False, {"error": f"HTTP {exc.code}"}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, {"error": f"services unreachable: {exc}"}
