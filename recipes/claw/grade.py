"""The Claw grader: checks the services' final state after the harness exits; standard library only.

The generator ships this file at the top of every task's ``hidden/`` with ``seed.json`` (the initial state and
files) and ``check.json`` (the task's kind, its parameters and the changes it allows). Once the agent is gone the Env
places them in a read-only directory outside the working copy (``$ORCHARD_GRADER_DIR``) and runs
``python3 -I "$ORCHARD_GRADER_DIR/grade.py"`` in the working copy, which is input only: nothing of it is imported or
run. It reads ``.claw/state.json`` (the seed when absent: nothing changed) and the ``files/`` tree, checks the
outcome the task asks for, and looks for forbidden side effects: any record or file the task did not allow to change
that was deleted, modified or added (a message's ``read`` flag excepted). It writes
``$ORCHARD_GRADER_OUT/signals.json`` and exits 0 only when every check passes and there is no side effect.

Signals: one 0/1 signal per check of the task's kind (below), ``side_effects`` (how many), ``no_side_effects`` (0/1)
and ``progress`` = the mean of the checks and shares, halved when there is a side effect.

==================  ==========================================================================================
kind                checks
==================  ==========================================================================================
``schedule``        event_created, title, attendee, duration, in_window, no_conflict
``reply``           replied (to the right message), recipient, content, no_other_mail
``triage``          triaged (every rule-matched message has its folder and labels), triage_fraction (a share)
``contact``         contact_added, name, phone (digits compared), company
``tasks_from_mail`` tasks_created (every item, title matched), due_dates, task_fraction (a share)
``files``           moved (every move done, content intact), move_fraction (a share)
``meeting_request`` event_created, attendee, duration, in_window, no_conflict, replied, reply_has_time
``save_report``     file_saved, task_created, task_due, archived
==================  ==========================================================================================
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

OUT_ENV = "ORCHARD_GRADER_OUT"
SIGNALS_NAME = "signals.json"
STATE_FILE = ".claw/state.json"
FILES_ROOT = "files"
GRADER_DIR = Path(__file__).resolve().parent
COLLECTIONS = ("events", "messages", "contacts", "tasks")
IGNORED_FIELDS = {"messages": {"read"}}
"""Fields whose change is never a side effect (reading mail may mark it read)."""
SHARES = {"triage_fraction", "task_fraction", "move_fraction"}
"""Signals that are shares (partial credit), not pass/fail checks: they count in progress, not in success."""
MAX_FILE_BYTES = 1_000_000
MAX_STATE_BYTES = 64 * 1024 * 1024

JSON = dict[str, Any]


def norm(text: Any) -> str:
    """Case-folded, whitespace-collapsed, without surrounding punctuation: how titles are compared."""
    return re.sub(r"\s+", " ", str(text or "")).strip().strip(".!,;:\"'").strip().casefold()


def minutes(value: str) -> int:
    """A ``YYYY-MM-DDTHH:MM`` time as minutes since the epoch of ``datetime.min`` (for overlap arithmetic)."""
    moment = datetime.fromisoformat(value)
    return moment.toordinal() * 1440 + moment.hour * 60 + moment.minute


def overlaps(a: JSON, b: JSON) -> bool:
    """Whether two events share any minute."""
    return minutes(a["start"]) < minutes(b["end"]) and minutes(b["start"]) < minutes(a["end"])


def by_id(state: JSON, collection: str) -> dict[str, JSON]:
    """A collection's records by id."""
    return {record["id"]: record for record in state.get(collection, [])}


def new_records(seed: JSON, final: JSON, collection: str) -> list[JSON]:
    """Records of ``final`` that the seed did not have."""
    old = by_id(seed, collection)
    return [record for record in final.get(collection, []) if record["id"] not in old]


# ---------------------------------------------------------------------------------------------------- side effects
def side_effects(seed: JSON, final: JSON, seed_files: dict[str, str], files: dict[str, str], allow: JSON) -> list[str]:
    """Every change the task did not allow, described."""
    found = []
    for collection in COLLECTIONS:
        before, after = by_id(seed, collection), by_id(final, collection)
        mutable = set(allow.get("modify", {}).get(collection, []))
        ignored = IGNORED_FIELDS.get(collection, set())
        for record_id, record in before.items():
            if record_id not in after:
                if record_id not in set(allow.get("remove", {}).get(collection, [])):
                    found.append(f"{collection}: {record_id} was deleted")
            elif record_id not in mutable:
                changed = sorted(
                    k for k in {*record, *after[record_id]} - ignored if record.get(k) != after[record_id].get(k)
                )
                if changed:
                    found.append(f"{collection}: {record_id} was modified ({', '.join(changed)})")
        added = len(after.keys() - before.keys())
        if added > int(allow.get("new", {}).get(collection, 0)):
            found.append(f"{collection}: {added} records added, {allow.get('new', {}).get(collection, 0)} allowed")
    moved_from, written = set(allow.get("files_removed", [])), set(allow.get("files_written", []))
    for path, content in seed_files.items():
        if path not in files and path not in moved_from:
            found.append(f"files: {path} was deleted")
        elif path in files and files[path] != content and path not in written:
            found.append(f"files: {path} was modified")
    found.extend(f"files: {path} was added" for path in sorted(files.keys() - seed_files.keys() - written))
    return found


# ---------------------------------------------------------------------------------------------------- checks
def _event_checks(check: JSON, seed: JSON, final: JSON) -> tuple[JSON | None, JSON]:
    """The new event that best matches ``check`` and its signals (shared by schedule and meeting_request)."""
    created = new_records(seed, final, "events")
    attendee = check["attendee"].casefold()

    def fit(event: JSON) -> tuple[int, int]:
        emails = [a.casefold() for a in event.get("attendees", [])]
        return (int(norm(event.get("title")) == norm(check.get("title", ""))), int(attendee in emails))

    event = max(created, key=fit) if created else None
    if event is None:
        return None, {"event_created": 0.0, "attendee": 0.0, "duration": 0.0, "in_window": 0.0, "no_conflict": 0.0}
    others = [e for e in final.get("events", []) if e["id"] != event["id"]]
    length = minutes(event["end"]) - minutes(event["start"])
    window = minutes(check["window_start"]) <= minutes(event["start"]) and minutes(event["end"]) <= minutes(
        check["window_end"]
    )
    return event, {
        "event_created": 1.0,
        "attendee": float(attendee in [a.casefold() for a in event.get("attendees", [])]),
        "duration": float(length == check["duration"]),
        "in_window": float(window),
        "no_conflict": float(not any(overlaps(event, other) for other in others)),
    }


def check_schedule(check: JSON, seed: JSON, final: JSON, files: dict[str, str]) -> JSON:
    """A new event with the title, attendee and duration, inside the window, overlapping nothing."""
    event, signals = _event_checks(check, seed, final)
    signals["title"] = float(event is not None and norm(event.get("title")) == norm(check["title"]))
    return signals


def _replies(seed: JSON, final: JSON) -> list[JSON]:
    return [m for m in new_records(seed, final, "messages") if m.get("folder") == "sent"]


def check_reply(check: JSON, seed: JSON, final: JSON, files: dict[str, str]) -> JSON:
    """A reply to the target message, to its sender, saying the keyword; no other mail sent."""
    sent = _replies(seed, final)
    right = [m for m in sent if m.get("in_reply_to") == check["target_id"]]
    recipient = check["recipient"].casefold()
    return {
        "replied": float(bool(right)),
        "recipient": float(any(recipient in [a.casefold() for a in m.get("to", [])] for m in right)),
        "content": float(any(check["keyword"].casefold() in m.get("body", "").casefold() for m in right)),
        "no_other_mail": float(len(sent) == len(right)),
    }


def check_triage(check: JSON, seed: JSON, final: JSON, files: dict[str, str]) -> JSON:
    """Every rule-matched message in its expected folder with its expected labels."""
    messages = by_id(final, "messages")
    done = 0
    for message_id, want in check["expected"].items():
        message = messages.get(message_id)
        if (
            message is not None
            and message.get("folder") == want["folder"]
            and set(want["labels"]) <= {label.casefold() for label in message.get("labels", [])}
        ):
            done += 1
    total = len(check["expected"])
    return {"triaged": float(done == total), "triage_fraction": round(done / total, 6) if total else 1.0}


def _digits(text: Any) -> str:
    return re.sub(r"\D", "", str(text or ""))


def check_contact(check: JSON, seed: JSON, final: JSON, files: dict[str, str]) -> JSON:
    """A new contact with the signature's email, name, phone and company."""
    found = [
        c for c in new_records(seed, final, "contacts") if c.get("email", "").casefold() == check["email"].casefold()
    ]
    contact = found[0] if found else {}
    return {
        "contact_added": float(bool(found)),
        "name": float(bool(found) and norm(contact.get("name")) == norm(check["name"])),
        "phone": float(bool(found) and _digits(contact.get("phone")) == _digits(check["phone"])),
        "company": float(bool(found) and norm(contact.get("company")) == norm(check["company"])),
    }


def _title_matches(actual: Any, expected: str) -> bool:
    return norm(actual) == norm(expected) or (len(norm(expected)) > 8 and norm(expected) in norm(actual))


def check_tasks_from_mail(check: JSON, seed: JSON, final: JSON, files: dict[str, str]) -> JSON:
    """One new task per action item (title as written), each with its due date."""
    created = new_records(seed, final, "tasks")
    found = dued = 0
    for item in check["tasks"]:
        matches = [t for t in created if _title_matches(t.get("title"), item["title"])]
        found += bool(matches)
        dued += any(t.get("due") == item["due"] for t in matches)
    total = len(check["tasks"])
    return {
        "tasks_created": float(found == total),
        "due_dates": float(dued == total),
        "task_fraction": round((found + dued) / (2 * total), 6),
    }


def check_files(check: JSON, seed: JSON, final: JSON, files: dict[str, str]) -> JSON:
    """Every file moved to its destination with its content, gone from its source."""
    seed_files = check["_seed_files"]
    done = sum(1 for src, dst in check["moves"].items() if src not in files and files.get(dst) == seed_files.get(src))
    total = len(check["moves"])
    return {"moved": float(done == total), "move_fraction": round(done / total, 6)}


def check_meeting_request(check: JSON, seed: JSON, final: JSON, files: dict[str, str]) -> JSON:
    """The requested meeting booked without conflicts, and the request answered with its start time."""
    event, signals = _event_checks(check, seed, final)
    right = [m for m in _replies(seed, final) if m.get("in_reply_to") == check["target_id"]]
    start = event["start"][11:16] if event else None
    signals["replied"] = float(bool(right))
    signals["reply_has_time"] = float(start is not None and any(start in m.get("body", "") for m in right))
    return signals


def check_save_report(check: JSON, seed: JSON, final: JSON, files: dict[str, str]) -> JSON:
    """The report saved verbatim, the review task added with its due date, the message archived."""
    tasks = [t for t in new_records(seed, final, "tasks") if _title_matches(t.get("title"), check["task_title"])]
    message = by_id(final, "messages").get(check["message_id"], {})
    saved = files.get(check["path"])
    return {
        "file_saved": float(saved is not None and saved.strip() == check["content"].strip()),
        "task_created": float(bool(tasks)),
        "task_due": float(any(t.get("due") == check["due"] for t in tasks)),
        "archived": float(message.get("folder") == "archive"),
    }


CHECKS: dict[str, Callable[[JSON, JSON, JSON, dict[str, str]], JSON]] = {
    "schedule": check_schedule,
    "reply": check_reply,
    "triage": check_triage,
    "contact": check_contact,
    "tasks_from_mail": check_tasks_from_mail,
    "files": check_files,
    "meeting_request": check_meeting_request,
    "save_report": check_save_report,
}


# ---------------------------------------------------------------------------------------------------- entry
def read_files(workdir: Path) -> dict[str, str]:
    """The ``files/`` tree as relative path -> text (symbolic links and oversized files read as markers)."""
    root = workdir / FILES_ROOT
    out: dict[str, str] = {}
    if not root.is_dir() or root.is_symlink():
        return out
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[relative] = "\0symlink"
        elif path.is_file():
            out[relative] = (
                "\0oversized" if path.stat().st_size > MAX_FILE_BYTES else path.read_text("utf-8", errors="replace")
            )
    return out


def read_state(path: Path) -> JSON:
    """The services' final state; ``ValueError`` when it is not a regular file holding a JSON object (a FIFO or
    device would block, and unreadable state must not hide what the agent did)."""
    if not path.is_file():
        raise ValueError(f"{STATE_FILE} is not a regular file")
    try:
        path.resolve().relative_to(path.parent.parent.resolve())
    except ValueError:
        raise ValueError(f"{STATE_FILE} links out of the working copy") from None
    if path.stat().st_size > MAX_STATE_BYTES:
        raise ValueError(f"{STATE_FILE} is larger than {MAX_STATE_BYTES} bytes")
    try:
        final = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(final, dict):
        raise ValueError("state is not an object")
    return final


def grade(workdir: Path, grader_dir: Path = GRADER_DIR) -> tuple[bool, JSON, list[str]]:
    """(success, signals, side effects) of the working copy ``workdir``."""
    seed = json.loads((grader_dir / "seed.json").read_text(encoding="utf-8"))
    check = json.loads((grader_dir / "check.json").read_text(encoding="utf-8"))
    state_path = workdir / STATE_FILE
    try:
        final = read_state(state_path) if state_path.exists() or state_path.is_symlink() else seed["state"]
    except ValueError as exc:
        return False, {"state_readable": 0.0, "progress": 0.0}, [f"unreadable state: {exc}"]
    files = read_files(workdir)
    signals = CHECKS[check["kind"]]({**check, "_seed_files": seed["files"]}, seed["state"], final, files)
    effects = side_effects(seed["state"], final, seed["files"], files, check.get("allow", {}))
    passed = all(value == 1.0 for name, value in signals.items() if name not in SHARES)
    progress = sum(signals.values()) / len(signals) if signals else 0.0  # a share counts as a check of its own
    signals.update(
        side_effects=float(len(effects)),
        no_side_effects=float(not effects),
        progress=round(progress * (1.0 if not effects else 0.5), 6),
    )
    return passed and not effects, signals, effects


def signals_path() -> Path:
    """``$ORCHARD_GRADER_OUT/signals.json``; exits with an error naming the variable when it is not set."""
    out = os.environ.get(OUT_ENV)
    if not out:
        raise SystemExit(f"grade: {OUT_ENV} is not set (the Env's Sandbox.run_grader sets it)")
    return Path(out) / SIGNALS_NAME


def main() -> int:
    """Grade the current directory; exit status 0 only on success."""
    target = signals_path()
    success, signals, effects = grade(Path.cwd())
    target.write_text(json.dumps(signals, sort_keys=True) + "\n", encoding="utf-8")
    sys.stdout.write(
        json.dumps({"success": success, "signals": signals, "side_effects": effects}, sort_keys=True) + "\n"
    )
    return 0 if success else 1


if __name__ == "__main__":
    sys.exit(main())
