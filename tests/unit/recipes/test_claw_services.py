"""The Claw services' REST API and tool layer: records are created, changed and removed as documented, every change
is saved to the working copy at once, refused requests change nothing, and the files service stays in its tree."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recipes.claw.services import SEED_FILE, STATE_FILE, BackgroundServices, ClawHTTPServer, ClawState
from recipes.claw.tools import TOOL_SPECS, call_tool, mcp_tools, openai_tools, request_for

SEED = {
    "now": "2026-03-02T08:30",
    "user": {"name": "Ada Abbott", "email": "ada.abbott@orchard.example"},
    "events": [
        {
            "id": "ev-1",
            "title": "Standup",
            "start": "2026-03-03T09:00",
            "end": "2026-03-03T09:30",
            "attendees": [],
            "location": "",
            "notes": "",
        },
    ],  # fmt: skip
    "messages": [
        {
            "id": "m-1",
            "folder": "inbox",
            "from": "ben.bauer@globex.example",
            "from_name": "Ben Bauer",
            "to": ["ada.abbott@orchard.example", "cara@globex.example"],
            "cc": [],
            "subject": "Budget",
            "body": "Which day?",
            "date": "2026-03-01T10:00",
            "labels": [],
            "read": False,
            "in_reply_to": None,
        },
    ],  # fmt: skip
    "contacts": [
        {"id": "c-1", "name": "Ben Bauer", "email": "ben.bauer@globex.example", "phone": "", "company": "", "title": ""}
    ],  # fmt: skip
    "tasks": [],
}


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Services over a working copy seeded with ``SEED`` and one file."""
    (tmp_path / SEED_FILE).parent.mkdir()
    (tmp_path / SEED_FILE).write_text(json.dumps(SEED))
    (tmp_path / "files" / "docs").mkdir(parents=True)
    (tmp_path / "files" / "docs" / "a.txt").write_text("alpha\n")
    with BackgroundServices(tmp_path) as running:
        yield running.url, tmp_path


def saved(workdir: Path) -> dict[str, Any]:
    """The state file as the grader would read it."""
    return json.loads((workdir / STATE_FILE).read_text())  # type: ignore[no-any-return]


def test_reading_changes_nothing_and_a_change_is_saved_at_once(services: tuple[str, Path]) -> None:
    url, workdir = services
    assert call_tool(url, "world_info", {})[1] == {"now": SEED["now"], "user": SEED["user"]}
    assert call_tool(url, "mail_list", {})[1]["messages"][0]["id"] == "m-1"
    assert call_tool(url, "calendar_list_events", {"date": "2026-03-03"})[1]["events"][0]["id"] == "ev-1"
    assert not (workdir / STATE_FILE).exists()

    arguments = {"title": "Sync", "start": "2026-03-03T10:00", "duration_minutes": 45, "attendees": ["b@x.example"]}
    ok, event = call_tool(url, "calendar_create_event", arguments)
    assert ok and (event["id"], event["end"]) == ("ev-2", "2026-03-03T10:45")
    assert [e["id"] for e in saved(workdir)["events"]] == ["ev-1", "ev-2"]
    ok, moved = call_tool(url, "calendar_update_event", {"event_id": "ev-2", "start": "2026-03-03T11:00"})
    assert ok and (moved["start"], moved["end"]) == ("2026-03-03T11:00", "2026-03-03T11:45")  # duration kept
    assert call_tool(url, "calendar_delete_event", {"event_id": "ev-2"})[0]
    ok, again = call_tool(
        url, "calendar_create_event", {"title": "X", "start": "2026-03-04T10:00", "end": "2026-03-04T11:00"}
    )
    assert again["id"] == "ev-3"  # ids are never reused


def test_replies_deletion_and_labels_follow_the_mail_rules(services: tuple[str, Path]) -> None:
    url, workdir = services
    ok, reply = call_tool(url, "mail_reply", {"message_id": "m-1", "body": "Thursday.", "reply_all": True})
    assert ok and (reply["subject"], reply["to"], reply["cc"], reply["in_reply_to"], reply["folder"]) == (
        "Re: Budget", ["ben.bauer@globex.example"], ["cara@globex.example"], "m-1", "sent",
    )  # fmt: skip
    assert call_tool(url, "mail_update", {"message_id": "m-1", "add_labels": ["finance"], "read": True})[0]
    assert call_tool(url, "mail_delete", {"message_id": "m-1"})[1] == {"trashed": "m-1"}
    message = next(m for m in saved(workdir)["messages"] if m["id"] == "m-1")
    assert (message["folder"], message["labels"], message["read"]) == ("trash", ["finance"], True)
    assert call_tool(url, "mail_list", {"folder": "trash"})[1]["messages"][0]["id"] == "m-1"
    assert call_tool(url, "mail_delete", {"message_id": "m-1"})[1] == {"deleted": "m-1"}


def test_refused_requests_name_the_problem_and_change_nothing(services: tuple[str, Path]) -> None:
    url, workdir = services
    cases = [
        ("contacts_create", {"name": "Ben", "email": "BEN.BAUER@globex.example"}, "already has the email"),
        ("calendar_create_event", {"title": "X", "start": "tomorrow", "duration_minutes": 30}, "start must be"),
        ("calendar_create_event", {"title": "X", "start": "2026-03-03T10:00", "end": "2026-03-03T09:00"}, "after"),
        ("mail_update", {"message_id": "m-1", "folder": "spam"}, "folder must be"),
        ("mail_send", {"to": ["not-an-address"], "subject": "s", "body": "b"}, "not an email address"),
        ("tasks_update", {"task_id": "t-9", "done": True}, "no task with id 't-9'"),
        ("files_read", {"path": "../.claw/seed.json"}, "leaves the files root"),
        ("files_move", {"src": "docs/a.txt", "dst": "docs/a.txt"}, "already exists"),
        ("calendar_delete_event", {}, "'event_id' is required"),
        ("no_such_tool", {}, "unknown tool"),
    ]
    for name, arguments, message in cases:
        ok, answer = call_tool(url, name, arguments)
        assert not ok and message in answer["error"], (name, answer)
    assert not (workdir / STATE_FILE).exists()


def test_the_files_service_works_on_real_files_in_the_working_copy(services: tuple[str, Path]) -> None:
    url, workdir = services
    assert call_tool(url, "files_write", {"path": "files/reports/w1.txt", "content": "ok\n"})[0]  # "files/" accepted
    assert call_tool(url, "files_move", {"src": "docs/a.txt", "dst": "archive/2026/a.txt"})[0]
    assert (workdir / "files" / "archive" / "2026" / "a.txt").read_text() == "alpha\n"
    listed = call_tool(url, "files_list", {})[1]["files"]
    assert [f["path"] for f in listed] == ["archive/2026/a.txt", "reports/w1.txt"]
    assert call_tool(url, "files_read", {"path": "reports/w1.txt"})[1]["content"] == "ok\n"
    (workdir / "files" / "link").symlink_to(workdir / ".claw")
    ok, answer = call_tool(url, "files_read", {"path": "link/seed.json"})
    assert not ok and "symbolic link" in answer["error"]
    assert call_tool(url, "files_delete", {"path": "reports/w1.txt"})[0]
    assert not (workdir / "files" / "reports" / "w1.txt").exists()


def test_tasks_and_contacts_round_trip(services: tuple[str, Path]) -> None:
    url, workdir = services
    ok, task = call_tool(url, "tasks_create", {"title": "Send budget", "due": "2026-03-05"})
    assert ok and task == {"id": "t-1", "title": "Send budget", "due": "2026-03-05", "done": False, "notes": ""}
    assert call_tool(url, "tasks_update", {"task_id": "t-1", "done": True})[1]["done"] is True
    assert call_tool(url, "tasks_list", {})[1]["tasks"] == []
    assert [t["id"] for t in call_tool(url, "tasks_list", {"status": "done"})[1]["tasks"]] == ["t-1"]
    ok, contact = call_tool(url, "contacts_create", {"name": "Cara", "email": "cara@globex.example", "phone": "+1 5"})
    assert ok and contact["id"] == "c-2"
    assert [c["id"] for c in call_tool(url, "contacts_search", {"query": "globex"})[1]["contacts"]] == ["c-1", "c-2"]
    assert saved(workdir)["contacts"][1]["phone"] == "+1 5"


def test_the_services_bind_loopback_only_and_resume_from_the_saved_state(tmp_path: Path) -> None:
    (tmp_path / SEED_FILE).parent.mkdir()
    (tmp_path / SEED_FILE).write_text(json.dumps(SEED))
    with pytest.raises(ValueError, match="loopback only"):
        ClawHTTPServer(ClawState(tmp_path), host="0.0.0.0")  # noqa: S104 - the refused case
    with BackgroundServices(tmp_path) as running:
        call_tool(running.url, "tasks_create", {"title": "Persisted"})
    assert [t["title"] for t in ClawState(tmp_path).data["tasks"]] == ["Persisted"]
    with pytest.raises(FileNotFoundError, match="seed.json"):
        ClawState(tmp_path / "elsewhere")


def test_every_tool_is_offered_the_same_way_to_openai_and_mcp_clients() -> None:
    names = [spec.name for spec in TOOL_SPECS]
    assert len(names) == len(set(names)) >= 20
    assert [t["function"]["name"] for t in openai_tools()] == [t["name"] for t in mcp_tools()] == names
    for openai, mcp in zip(openai_tools(), mcp_tools(), strict=True):
        assert openai["function"]["parameters"] == mcp["inputSchema"]
        assert set(mcp["inputSchema"]["required"]) <= set(mcp["inputSchema"]["properties"])
    assert request_for("mail_list", {"folder": "all", "unread_only": True}) == (
        "GET", "/mail/messages?folder=all&unread_only=true", {},
    )  # fmt: skip
    assert request_for("mail_reply", {"message_id": "m/1", "body": "b"}) == (
        "POST", "/mail/messages/m%2F1/reply", {"body": "b"},
    )  # fmt: skip
