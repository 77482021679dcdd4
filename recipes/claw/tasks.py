"""Generates the Claw task suite: seeded personal-assistant tasks over the Claw services, train and held-out splits.

Each task is a small world (the user, "now", a week of calendar events, an inbox, contacts, a task list and a few
files), one instruction, a grader check of the final state (``grade.py``) with the changes the task allows, a
reference solution and a wrong one (tool calls of ``recipes.claw.tools``). Kinds (``KINDS``):

===================  ===============================================================  ===========================
kind                 the task                                                         the wrong solution
===================  ===============================================================  ===========================
``schedule``         book a meeting with a contact inside a window, without conflicts  a conflicting meeting
``reply``            reply to one person's mail about one topic                       replies to the wrong mail
``triage``           label one domain's mail, archive newsletters (or trash promos)   also trashes an unrelated mail
``contact``          add a mail's sender from their signature                         the office line as phone
``tasks_from_mail``  one task per action item of a mail, with due dates               one due date a day late
``files``            move invoices into a folder, rename a note                       also deletes an unrelated file
``meeting_request``  book a meeting a mail asks for and reply with its time          a conflicting meeting
``save_report``      save a mail's body as a file, add a review task, archive mail    trashes the mail
===================  ===============================================================  ===========================

Layout written by ``generate``::

    OUT/manifest.json                      config, each split's task ids and kinds
    OUT/train/<task_id>/task.yaml          an Orchard task directory (``orchard.env.tasks.load_task``)
                       /workspace/.claw/seed.json, workspace/files/...
                       /hidden/grade.py, check.json, seed.json   the grader (run from outside the working copy)
    OUT/eval/<task_id>/...                 held out: other seeds, no instruction and world shared with train
    OUT/solutions/<split>/<task_id>.json   reference and wrong tool calls (never copied into a sandbox)

The same config always writes byte-identical trees. Run:
``python -m recipes.claw.tasks OUT [--seed 0] [--train-per-kind 8] [--eval-per-kind 2]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from orchard.logging import get_logger
from recipes.claw.services import SEED_FILE, TIME_FORMAT
from recipes.model_options import add_model_options, model_from_options

log = get_logger("recipes.claw")

JSON = dict[str, Any]
ToolCall = dict[str, Any]
Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")
GRADE_SCRIPT = Path(__file__).resolve().parent / "grade.py"
GRADE_COMMAND = 'python3 -I "$ORCHARD_GRADER_DIR/grade.py"'
"""The Env places ``hidden/`` in ``$ORCHARD_GRADER_DIR``; ``-I`` keeps the working copy off the grader's path."""
SOLUTIONS_DIR = "solutions"

FIRST = ("Ada", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Liam", "Maya",
         "Nils", "Olga", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wes", "Xena", "Yusuf", "Zoe",
         "Aiko", "Bruno", "Carla", "Dmitri")  # fmt: skip
LAST = ("Abbott", "Bauer", "Castro", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ivanova", "Jensen",
        "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov", "Quintero", "Rossi", "Schmidt", "Tanaka",
        "Ueda", "Varga", "Weber", "Xu", "Yilmaz", "Zimmer")  # fmt: skip
COMPANIES = (("Northwind Traders", "northwind.example"), ("Globex", "globex.example"), ("Initech", "initech.example"),
             ("Umbrella Labs", "umbrella.example"), ("Acme Corp", "acme.example"), ("Hooli", "hooli.example"),
             ("Vandelay Imports", "vandelay.example"), ("Tyrell Systems", "tyrell.example"),
             ("Soylent Foods", "soylent.example"), ("Wayne Analytics", "wayne.example"))  # fmt: skip
USER_DOMAIN = "orchard.example"
EVENT_TITLES = ("Team standup", "Design review", "Budget sync", "Customer call", "Sprint planning", "Interview",
                "Board prep", "Focus time", "All-hands", "Vendor demo", "Dentist", "Gym")  # fmt: skip
MEETING_TITLES = ("Quarterly planning", "Roadmap chat", "Hiring sync", "Vendor review", "Offsite prep",
                  "Pricing discussion", "Launch retro", "Partnership intro", "Security review",
                  "Onboarding plan")  # fmt: skip
CHATTER = (("Lunch on Friday?", "Are you free for lunch on Friday? There is a new ramen place nearby."),
           ("Slides for tomorrow", "I uploaded the slides for tomorrow's meeting to the shared drive."),
           ("Parking update", "The north parking lot is closed next week for repairs."),
           ("Travel receipts", "Please remember to send your travel receipts by the end of the month."),
           ("Team photo", "The team photo is scheduled for Thursday at noon in the atrium."),
           ("Conference tickets", "Early-bird tickets for the spring conference end this week."),
           ("Coffee machine", "The coffee machine on the third floor is fixed."),
           ("Holiday schedule", "The office holiday schedule for next year is attached."),
           ("Quick question", "Do you know who owns the shared analytics dashboard?"),
           ("Welcome aboard", "Please welcome our new colleague who joins the data team on Monday."))  # fmt: skip
TOPICS = (("Budget review", "the budget review", "Can you confirm which day works for the budget review?",
           "Thursday works for me for the budget review.", "Thursday"),
          ("Offsite venue", "the offsite venue",
           "Which venue do you prefer for the offsite, the lake house or the loft?", "I prefer the lake house.",
           "lake house"),
          ("Invoice 4471", "invoice 4471", "Has invoice 4471 been paid yet? Our system still shows it as open.",
           "Invoice 4471 was paid last Friday.", "paid"),
          ("Contract renewal", "the contract renewal", "Should we renew the contract for one year or two?",
           "Let us renew for two years.", "two years"),
          ("Hiring panel", "the hiring panel", "Can you join the hiring panel next week?",
           "Yes, I can join the hiring panel.", "yes"),
          ("Demo feedback", "the demo feedback", "What did you think of the demo on Monday?",
           "The demo was great, ship it.", "ship it"),
          ("Server migration", "the server migration", "Is Saturday night fine for the server migration?",
           "Saturday night is fine for the migration.", "Saturday"),
          ("Catering order", "the catering order", "How many vegetarian meals should we order for the workshop?",
           "Please order twelve vegetarian meals.", "twelve"))  # fmt: skip
ACTION_ITEMS = ("Send the revised budget", "Book the meeting room", "Review the launch checklist",
                "Update the customer FAQ", "Draft the press release", "Collect vendor quotes",
                "Prepare the demo script", "Order new badges", "Schedule the user interviews",
                "Archive the old tickets", "Write the release notes", "Check the travel policy")  # fmt: skip
PROJECTS = ("Apollo", "Borealis", "Cobalt", "Delta", "Ember", "Falcon", "Granite", "Horizon", "Ivy", "Juniper")
BACKGROUND_TASKS = ("Renew passport", "Call the plumber", "Buy a birthday gift", "Submit expense report",
                    "Water the plants", "Pay the electricity bill")  # fmt: skip
BACKGROUND_FILES = {"notes/ideas.txt": "Ideas:\n- a reading club\n- a quieter meeting room\n",
                    "docs/handbook.txt": "Employee handbook, edition 3.\nAsk HR for the full version.\n",
                    "personal/recipes.txt": "Pancakes: flour, milk, eggs, a pinch of salt.\n",
                    "photos/list.txt": "beach.jpg\nmountain.jpg\ncity.jpg\n"}  # fmt: skip
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


class ClawConfig(BaseModel):
    """What to generate; every field is also a command-line option."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="Seed of both splits' random streams.")
    train_per_kind: int = Field(8, ge=0, description="Train tasks of each kind.")
    eval_per_kind: int = Field(2, ge=1, description="Held-out tasks of each kind.")
    max_steps: int = Field(20, ge=4, description="Model calls the harness may make (references need 3 to 10).")
    harness_timeout_s: float = Field(300.0, gt=0, description="Wall-clock limit of the harness.")
    grade_timeout_s: float = Field(60.0, gt=0, description="Wall-clock limit of the grader.")
    memory_mb: int = Field(0, ge=0, description="Sandbox memory limit, MiB (0: the runtime's default; OpenClaw: 8192).")


def call(name: str, /, **arguments: Any) -> ToolCall:
    """One tool call of a solution."""
    return {"name": name, "arguments": arguments}


@dataclass
class ClawTask:
    """One generated task: the world, the instruction, the grader's check, and two solutions."""

    task_id: str
    kind: str
    instruction: str
    state: JSON
    files: dict[str, str]
    check: JSON
    reference: list[ToolCall]
    wrong: list[ToolCall]
    wrong_outcome: str

    @property
    def fingerprint(self) -> str:
        """What makes two tasks the same task (id aside): instruction, state and files."""
        body = json.dumps([self.instruction, self.state, self.files], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def solutions(self) -> JSON:
        """The solutions file (kept outside the task directory)."""
        return {
            "task_id": self.task_id,
            "kind": self.kind,
            "reference": self.reference,
            "wrong": self.wrong,
            "wrong_outcome": self.wrong_outcome,
        }


# ---------------------------------------------------------------------------------------------------- worlds
def at(day: date, hhmm: str) -> str:
    """``YYYY-MM-DDTHH:MM`` of a day and a clock time."""
    return f"{day.isoformat()}T{hhmm}"


def clock(minute_of_day: int) -> str:
    """``HH:MM`` of a minute of the day."""
    return f"{minute_of_day // 60:02d}:{minute_of_day % 60:02d}"


def day_name(day: date) -> str:
    """``Wednesday 2026-03-04``."""
    return f"{WEEKDAYS[day.weekday()]} {day.isoformat()}"


@dataclass
class Person:
    """Someone in the world."""

    first: str
    last: str
    company: str
    domain: str

    @property
    def name(self) -> str:
        """Full name."""
        return f"{self.first} {self.last}"

    @property
    def email(self) -> str:
        """Their address."""
        return f"{self.first}.{self.last}@{self.domain}".lower()


@dataclass
class World:
    """A task's world under construction; ``finalize`` assigns ids and dates."""

    rng: random.Random
    monday: date
    user: Person
    people: list[Person] = field(default_factory=list)
    events: list[JSON] = field(default_factory=list)
    messages: list[JSON] = field(default_factory=list)
    contacts: list[JSON] = field(default_factory=list)
    tasks: list[JSON] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def new(cls, rng: random.Random) -> World:
        """A world with a user, a week, and a crowd of people (none sharing a name)."""
        monday = date(2026, 1, 5) + timedelta(weeks=rng.randrange(40))
        names = rng.sample([(f, last) for f in FIRST for last in LAST], 14)
        people = [Person(f, last, *rng.choice(COMPANIES)) for f, last in names[1:]]
        world = cls(rng, monday, Person(*names[0], "Orchard", USER_DOMAIN), people)
        return world

    @property
    def now(self) -> str:
        """Monday 08:30 of the week."""
        return at(self.monday, "08:30")

    def stranger(self) -> Person:
        """A person not yet used for anything special (removed from the pool)."""
        return self.people.pop()

    def day(self, index: int) -> date:
        """Weekday ``index`` (0 = Monday) of the week."""
        return self.monday + timedelta(days=index)

    def add_event(self, title: str, day: date, start: int, length: int, attendees: Sequence[str] = ()) -> JSON:
        """An event on ``day`` from minute ``start`` for ``length`` minutes."""
        event = {
            "id": "",
            "title": title,
            "start": at(day, clock(start)),
            "end": at(day, clock(start + length)),
            "attendees": list(attendees),
            "location": "",
            "notes": "",
        }
        self.events.append(event)
        return event

    def add_message(
        self, sender: Person, subject: str, body: str, *, folder: str = "inbox", read: bool = False
    ) -> JSON:
        """A received message (its date is set by ``finalize``)."""
        message = {
            "id": "",
            "folder": folder,
            "from": sender.email,
            "from_name": sender.name,
            "to": [self.user.email],
            "cc": [],
            "subject": subject,
            "body": body,
            "date": "",
            "labels": [],
            "read": read,
            "in_reply_to": None,
        }
        self.messages.append(message)
        return message

    def add_contact(self, person: Person, phone: str | None = None) -> JSON:
        """A contact for ``person``."""
        phone = phone or self.phone()
        contact = {
            "id": "",
            "name": person.name,
            "email": person.email,
            "phone": phone,
            "company": person.company,
            "title": "",
        }
        self.contacts.append(contact)
        return contact

    def phone(self) -> str:
        """A fictional phone number."""
        return f"+1 555 {self.rng.randrange(100, 1000):03d} {self.rng.randrange(1000, 10000):04d}"

    def background(self, *, busy_day: date | None = None, mails: int = 5) -> None:
        """Ordinary life: events on each weekday but ``busy_day``, chatter mails, contacts, tasks and files."""
        for index in range(5):
            day = self.day(index)
            if day == busy_day:
                continue
            for start in sorted(self.rng.sample(range(16, 36, 2), self.rng.randint(1, 3))):
                self.add_event(self.rng.choice(EVENT_TITLES), day, start * 30, self.rng.choice((30, 60)))
        for subject, body in self.rng.sample(CHATTER, mails):
            sender = self.rng.choice(self.people)
            self.add_message(
                sender, subject, f"Hi {self.user.first},\n\n{body}\n\n{sender.first}", read=self.rng.random() < 0.5
            )
        for person in self.rng.sample(self.people, 5):
            self.add_contact(person)
        for title in self.rng.sample(BACKGROUND_TASKS, 3):
            due = self.day(self.rng.randrange(7)).isoformat() if self.rng.random() < 0.7 else None
            self.tasks.append({"id": "", "title": title, "due": due, "done": False, "notes": ""})
        for path in self.rng.sample(sorted(BACKGROUND_FILES), 3):
            self.files[path] = BACKGROUND_FILES[path]

    def finalize(self) -> None:
        """Shuffle, then give every record its id (and every message a date in the days before now)."""
        self.rng.shuffle(self.messages)
        self.rng.shuffle(self.contacts)
        self.events.sort(key=lambda e: (e["start"], e["title"]))
        moment = datetime.fromisoformat(self.now) - timedelta(days=3)
        for index, message in enumerate(self.messages, 1):
            moment += timedelta(minutes=self.rng.randint(20, 600))
            message["id"], message["date"] = f"m-{index}", moment.strftime(TIME_FORMAT)
        for prefix, records in (("ev", self.events), ("c", self.contacts), ("t", self.tasks)):
            for index, record in enumerate(records, 1):
                record["id"] = f"{prefix}-{index}"

    def state(self) -> JSON:
        """The services' seed state."""
        return {
            "now": self.now,
            "user": {"name": self.user.name, "email": self.user.email},
            "counters": {
                "ev": len(self.events),
                "m": len(self.messages),
                "c": len(self.contacts),
                "t": len(self.tasks),
            },
            "events": self.events,
            "messages": self.messages,
            "contacts": self.contacts,
            "tasks": self.tasks,
        }


def busy_window(world: World, day: date, duration: int) -> tuple[int, int, int]:
    """Fill a window of ``day`` with events so that its start is busy and some later slot is free.

    Returns (window start, window end, earliest free start), all minutes of the day."""
    rng = world.rng
    start = rng.choice((9, 10, 13, 14)) * 60
    end = start + rng.choice((180, 240))
    cursor = start + rng.choice((60, 90))
    world.add_event(rng.choice(EVENT_TITLES), day, start, cursor - start)
    free = rng.randrange(cursor, end - duration + 1, 30)
    while cursor < free:  # everything before the free slot is busy, in 30- or 60-minute pieces
        length = min(rng.choice((30, 60)), free - cursor)
        world.add_event(rng.choice(EVENT_TITLES), day, cursor, length)
        cursor += length
    cursor = free + duration
    while cursor < end:  # after it, a mix of busy and free time
        length = min(rng.choice((30, 60)), end - cursor)
        if rng.random() < 0.6:
            world.add_event(rng.choice(EVENT_TITLES), day, cursor, length)
        cursor += length
    if start >= 9 * 60 + 60:
        world.add_event("Team standup", day, 8 * 60 + 30, 15)  # busy outside the window too
    return start, end, earliest_free(world.events, day, start, end, duration)


def earliest_free(events: Sequence[JSON], day: date, start: int, end: int, duration: int) -> int:
    """The first 30-minute-aligned start in [start, end - duration] overlapping no event."""
    busy = [
        (int(e["start"][11:13]) * 60 + int(e["start"][14:16]), int(e["end"][11:13]) * 60 + int(e["end"][14:16]))
        for e in events
        if e["start"][:10] == day.isoformat()
    ]
    for candidate in range(start, end - duration + 1, 30):
        if all(candidate + duration <= lo or hi <= candidate for lo, hi in busy):
            return candidate
    raise ValueError("no free slot")


# ---------------------------------------------------------------------------------------------------- kinds
Built = tuple[str, JSON, list[ToolCall], list[ToolCall], str]
"""(instruction, check, reference, wrong, what the wrong solution gets wrong)."""


def build_schedule(world: World) -> Built:
    """Book a meeting with a contact inside a window, avoiding the calendar's events."""
    rng = world.rng
    day, duration, title = world.day(rng.randint(1, 4)), rng.choice((30, 60)), rng.choice(MEETING_TITLES)
    guest = world.stranger()
    world.background(busy_day=day)
    world.add_contact(guest)
    start, end, free = busy_window(world, day, duration)
    world.finalize()
    instruction = (
        f'Schedule a {duration}-minute meeting titled "{title}" with {guest.name} on {day_name(day)}. It must start '
        f"and end between {clock(start)} and {clock(end)} and must not overlap anything already on my calendar. "
        f"Invite {guest.first} (the address is in my contacts)."
    )
    check = {
        "kind": "schedule",
        "title": title,
        "attendee": guest.email,
        "duration": duration,
        "window_start": at(day, clock(start)),
        "window_end": at(day, clock(end)),
        "allow": {"new": {"events": 1}},
    }
    look = [call("contacts_search", query=guest.last), call("calendar_list_events", date=day.isoformat())]

    def book(minute: int) -> ToolCall:
        return call(
            "calendar_create_event",
            title=title,
            start=at(day, clock(minute)),
            duration_minutes=duration,
            attendees=[guest.email],
        )

    return instruction, check, [*look, book(free)], [*look, book(start)], "a meeting overlapping an existing event"


def build_reply(world: World) -> Built:
    """Reply to the right one of several similar mails."""
    rng = world.rng
    (subject, phrase, question, answer, keyword), (other_subject, _, other_question, *_) = rng.sample(TOPICS, 2)
    sender, other = world.stranger(), world.stranger()
    world.background(mails=4)
    world.add_contact(sender)
    target = world.add_message(sender, subject, f"Hi {world.user.first},\n\n{question}\n\n{sender.first}")
    same_sender = world.add_message(
        sender, other_subject, f"Hi {world.user.first},\n\n{other_question}\n\n{sender.first}"
    )
    world.add_message(other, f"Re: {subject}", f"Hi {world.user.first},\n\n{question}\n\nThanks,\n{other.first}")
    world.finalize()
    instruction = f"Reply to {sender.name}'s email about {phrase} and tell them: {answer}"
    check = {
        "kind": "reply",
        "target_id": target["id"],
        "recipient": sender.email,
        "keyword": keyword,
        "allow": {"new": {"messages": 1}},
    }
    body = f"Hi {sender.first},\n\n{answer}\n\nBest,\n{world.user.first}"
    reference = [
        call("mail_list", query=sender.last),
        call("mail_read", message_id=target["id"]),
        call("mail_reply", message_id=target["id"], body=body),
    ]
    wrong = [
        call("mail_list", query=sender.last),
        call("mail_read", message_id=same_sender["id"]),
        call("mail_reply", message_id=same_sender["id"], body=body),
    ]
    return instruction, check, reference, wrong, "a reply to another message of the same sender"


def build_triage(world: World) -> Built:
    """Label one domain's mail and archive newsletters (or trash promotions), leaving the rest alone."""
    rng = world.rng
    world.background(mails=5)
    company, domain = rng.choice(sorted({(p.company, p.domain) for p in world.people}))
    label = rng.choice(("vendors", "clients", "partners", "suppliers"))
    promos = rng.random() < 0.5
    at_domain = [p for p in world.people if p.domain == domain]
    labelled = [
        world.add_message(rng.choice(at_domain), s, f"Hi,\n\n{b}\n\nRegards") for s, b in rng.sample(CHATTER, 2)
    ]
    bulk = []
    for name, bulk_domain in rng.sample([c for c in COMPANIES if c[1] != domain], rng.randint(2, 3)):
        sender = Person("news", "letter", name, bulk_domain)
        subject = f"SALE: 30% off at {name}" if promos else f"[Newsletter] {name} weekly digest"
        bulk.append(world.add_message(sender, subject, f"The latest from {name}.", read=rng.random() < 0.5))
    for message in world.messages:  # chatter from the domain is labelled too: the rule is by address
        if message["from"].endswith("@" + domain) and message not in labelled:
            labelled.append(message)
    world.finalize()
    bulk_rule, folder = (
        ("move every promotion (subject starting with SALE:) to the trash", "trash")
        if promos
        else ("move every newsletter (subject starting with [Newsletter]) to the archive", "archive")
    )
    instruction = (
        f"Triage my inbox: label every email from anyone at {domain} ({company}) with the label '{label}', and "
        f"{bulk_rule}. Leave every other email exactly as it is."
    )
    expected = {m["id"]: {"folder": "inbox", "labels": [label]} for m in labelled}
    expected.update({m["id"]: {"folder": folder, "labels": []} for m in bulk})
    check = {"kind": "triage", "expected": expected, "allow": {"modify": {"messages": sorted(expected)}}}
    reference = [call("mail_list", folder="inbox")]
    reference += [call("mail_update", message_id=m["id"], add_labels=[label]) for m in sorted(labelled, key=_id)]
    reference += [call("mail_update", message_id=m["id"], folder=folder) for m in sorted(bulk, key=_id)]
    bystander = rng.choice(sorted((m for m in world.messages if m["id"] not in expected), key=_id))
    wrong = [*reference, call("mail_delete", message_id=bystander["id"])]
    return instruction, check, reference, wrong, "an unrelated email moved to the trash"


def _id(record: JSON) -> tuple[int, str]:
    prefix, _, number = record["id"].partition("-")
    return int(number), prefix


def build_contact(world: World) -> Built:
    """Add a mail's sender to the contacts from the signature (not the office line in the text)."""
    rng = world.rng
    person, mobile, office = world.stranger(), world.phone(), world.phone()
    world.background(mails=5)
    role = rng.choice(("Account Manager", "Head of Sales", "Project Lead", "Procurement Officer", "CTO"))
    subject = rng.choice(("Introduction", "Following up on our call", "Nice meeting you", "Partnership proposal"))
    body = (
        f"Hello {world.user.first},\n\nGreat to connect. For general questions you can also call our front desk at "
        f"{office}.\n\nBest regards,\n{person.name}\n{role}, {person.company}\nMobile: {mobile}\n{person.email}"
    )
    message = world.add_message(person, f"{subject} - {person.company}", body)
    world.finalize()
    instruction = (
        f'Add the sender of the email "{message["subject"]}" to my contacts with their name, email, mobile phone '
        "number and company, as written in the signature."
    )
    check = {
        "kind": "contact",
        "email": person.email,
        "name": person.name,
        "phone": mobile,
        "company": person.company,
        "allow": {"new": {"contacts": 1}},
    }
    look = [call("mail_list", query=message["subject"]), call("mail_read", message_id=message["id"])]
    fields = {"name": person.name, "email": person.email, "company": person.company}
    return (
        instruction,
        check,
        [*look, call("contacts_create", **fields, phone=mobile)],
        [*look, call("contacts_create", **fields, phone=office)],
        "the front desk's number as the phone",
    )


def build_tasks_from_mail(world: World) -> Built:
    """One task per action item of a mail, titled as written, with its due date."""
    rng = world.rng
    boss, colleague, project = world.stranger(), world.stranger(), rng.choice(PROJECTS)
    world.background(mails=4)
    items = [(title, world.day(rng.randint(1, 6))) for title in rng.sample(ACTION_ITEMS, rng.randint(2, 4))]
    lines = "\n".join(f"- {title} (due {day_name(due)})" for title, due in items)
    subject = f"Action items: {project}"
    world.add_contact(boss)
    message = world.add_message(
        boss,
        subject,
        f"Hi {world.user.first},\n\nFrom today's {project} meeting, "
        f"your action items:\n{lines}\n\nThanks,\n{boss.first}",
    )
    world.add_message(colleague, f"Re: {project} notes", f"Notes from the {project} meeting are in the wiki.")
    world.finalize()
    instruction = (
        f'Create a task in my task list for each of my action items in {boss.name}\'s email "{subject}", titled '
        "exactly as the item is written, with the item's due date."
    )
    check = {
        "kind": "tasks_from_mail",
        "tasks": [{"title": t, "due": d.isoformat()} for t, d in items],
        "allow": {"new": {"tasks": len(items)}},
    }
    look = [call("mail_list", query=subject), call("mail_read", message_id=message["id"])]
    reference = [*look, *(call("tasks_create", title=t, due=d.isoformat()) for t, d in items)]
    *rest, (last_title, last_due) = items
    late = (last_due + timedelta(days=1)).isoformat()
    wrong = [
        *look,
        *(call("tasks_create", title=t, due=d.isoformat()) for t, d in rest),
        call("tasks_create", title=last_title, due=late),
    ]
    return instruction, check, reference, wrong, "one task due a day late"


def build_files(world: World) -> Built:
    """Move the invoices into a year folder and rename one note, leaving other files alone."""
    rng = world.rng
    world.background(mails=4)
    year = world.monday.year
    invoices = [f"inbox/invoice-{n}.txt" for n in sorted(rng.sample(range(1000, 9999), rng.randint(2, 3)))]
    for path in invoices:
        world.files[path] = f"Invoice {path[14:18]}\nAmount due: {rng.randrange(50, 5000)}.00 EUR\n"
    world.files["inbox/receipt-coffee.txt"] = "Coffee beans, 12.50 EUR\n"
    note, new_name = rng.choice((("todo", "weekend-todo"), ("draft", "speech-draft"), ("scratch", "meeting-notes")))
    world.files[f"inbox/{note}.txt"] = f"{new_name.replace('-', ' ')}: remember to bring the charger\n"
    world.finalize()
    folder = f"finance/{year}/invoices"
    instruction = (
        f"In my files, move every invoice (inbox/invoice-*.txt) into {folder}/, keeping their file names, and move "
        f"inbox/{note}.txt to notes/{new_name}.txt. Leave all other files where they are."
    )
    moves = {path: f"{folder}/{path.split('/')[-1]}" for path in invoices}
    moves[f"inbox/{note}.txt"] = f"notes/{new_name}.txt"
    check = {
        "kind": "files",
        "moves": moves,
        "allow": {"files_removed": sorted(moves), "files_written": sorted(moves.values())},
    }
    reference = [call("files_list", path="inbox"), *(call("files_move", src=s, dst=d) for s, d in moves.items())]
    bystander = rng.choice(sorted(p for p in world.files if p not in moves))
    return (
        instruction,
        check,
        reference,
        [*reference, call("files_delete", path=bystander)],
        "an unrelated file deleted",
    )


def build_meeting_request(world: World) -> Built:
    """Book the meeting a mail asks for at a free time inside its window, then answer with the time."""
    rng = world.rng
    day, duration = world.day(rng.randint(1, 4)), rng.choice((30, 60))
    person = world.stranger()
    world.background(busy_day=day, mails=4)
    start, end, free = busy_window(world, day, duration)
    body = (
        f"Hi {world.user.first},\n\nCould we meet for {duration} minutes on {day_name(day)}, any time between "
        f"{clock(start)} and {clock(end)}? Please send me an invite.\n\nThanks,\n{person.first}"
    )
    message = world.add_message(person, "Meeting request", body)
    world.finalize()
    instruction = (
        f"{person.name} asked me for a meeting by email. Put it on my calendar at a time inside the window they "
        "asked for that does not overlap anything already on my calendar, invite them, then reply to their email "
        "with the meeting's start time (HH:MM)."
    )
    check = {
        "kind": "meeting_request",
        "target_id": message["id"],
        "attendee": person.email,
        "duration": duration,
        "window_start": at(day, clock(start)),
        "window_end": at(day, clock(end)),
        "allow": {"new": {"events": 1, "messages": 1}},
    }

    def book(minute: int) -> list[ToolCall]:
        reply = f"Hi {person.first},\n\nI booked us on {day_name(day)} at {clock(minute)}.\n\n{world.user.first}"
        return [
            call(
                "calendar_create_event",
                title=f"Meeting with {person.name}",
                start=at(day, clock(minute)),
                duration_minutes=duration,
                attendees=[person.email],
            ),
            call("mail_reply", message_id=message["id"], body=reply),
        ]

    look = [
        call("mail_list", query=person.last),
        call("mail_read", message_id=message["id"]),
        call("calendar_list_events", date=day.isoformat()),
    ]
    return instruction, check, [*look, *book(free)], [*look, *book(start)], "a meeting overlapping an existing event"


def build_save_report(world: World) -> Built:
    """Save a mail's body as a file, add a review task, archive the mail."""
    rng = world.rng
    person, project = world.stranger(), rng.choice(PROJECTS)
    world.background(mails=4)
    done, risk = rng.sample(ACTION_ITEMS, 2)
    content = (
        f"{project} weekly report\nDone: {done.lower()}.\nNext: {risk.lower()}.\n"
        f"Budget used: {rng.randint(20, 95)}%.\nRisks: none."
    )
    subject = f"{project} weekly report"
    message = world.add_message(person, subject, content)
    due = world.day(rng.randint(1, 4))
    world.finalize()
    path, title = f"reports/{project.lower()}-week.txt", f"Review {project} report"
    instruction = (
        f'Save the body of {person.name}\'s email "{subject}" as the file {path} in my files, add the task '
        f'"{title}" due {due.isoformat()} to my task list, then archive the email.'
    )
    check = {
        "kind": "save_report",
        "message_id": message["id"],
        "path": path,
        "content": content,
        "task_title": title,
        "due": due.isoformat(),
        "allow": {"new": {"tasks": 1}, "modify": {"messages": [message["id"]]}, "files_written": [path]},
    }
    steps = [
        call("mail_list", query=subject),
        call("mail_read", message_id=message["id"]),
        call("files_write", path=path, content=content),
        call("tasks_create", title=title, due=due.isoformat()),
    ]
    return (
        instruction,
        check,
        [*steps, call("mail_update", message_id=message["id"], folder="archive")],
        [*steps, call("mail_delete", message_id=message["id"])],
        "the email trashed instead of archived",
    )


KINDS: dict[str, Callable[[World], Built]] = {
    "schedule": build_schedule,
    "reply": build_reply,
    "triage": build_triage,
    "contact": build_contact,
    "tasks_from_mail": build_tasks_from_mail,
    "files": build_files,
    "meeting_request": build_meeting_request,
    "save_report": build_save_report,
}


# ---------------------------------------------------------------------------------------------------- writing
def sample_task(rng: random.Random, kind: str, task_id: str) -> ClawTask:
    """A random task of ``kind``."""
    world = World.new(rng)
    instruction, check, reference, wrong, wrong_outcome = KINDS[kind](world)
    return ClawTask(
        task_id,
        kind,
        instruction,
        world.state(),
        dict(sorted(world.files.items())),
        check,
        reference,
        wrong,
        wrong_outcome,
    )


def generate_tasks(config: ClawConfig) -> dict[Split, list[ClawTask]]:
    """Both splits, eval first: no train task repeats an eval task (or another train task)."""
    seen: set[str] = set()
    out: dict[Split, list[ClawTask]] = {}
    for split, per_kind in (("eval", config.eval_per_kind), ("train", config.train_per_kind)):
        rng = random.Random(f"claw:{config.seed}:{split}")  # noqa: S311 - task data, not secrets
        tasks: list[ClawTask] = []
        for kind in KINDS:
            made = 0
            while made < per_kind:
                task = sample_task(rng, kind, f"claw-{split}-{kind.replace('_', '-')}-{made:03d}")
                if task.fingerprint not in seen:
                    seen.add(task.fingerprint)
                    tasks.append(task)
                    made += 1
        out[split] = tasks
    return {split: out[split] for split in SPLITS}


def task_yaml(task: ClawTask, config: ClawConfig, split: Split) -> str:
    """The task's ``task.yaml``."""
    spec = {
        "task_id": task.task_id,
        "instruction": task.instruction,
        "grade_command": GRADE_COMMAND,
        "grade_timeout_s": config.grade_timeout_s,
        "harness_timeout_s": config.harness_timeout_s,
        "max_steps": config.max_steps,
        "labels": {"recipe": "claw", "kind": task.kind, "split": split},
    }
    if config.memory_mb:
        spec["limits"] = {"memory_mb": config.memory_mb}
    return yaml.safe_dump(spec, sort_keys=False)


def _dump(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_task(task: ClawTask, config: ClawConfig, split: Split, directory: Path) -> Path:
    """Write one task directory (workspace: seed state and files; hidden: the grader); returns it."""
    workspace = directory / "workspace"
    (workspace / SEED_FILE).parent.mkdir(parents=True)
    (workspace / SEED_FILE).write_text(_dump(task.state), encoding="utf-8")
    (workspace / "files").mkdir()
    for path, content in task.files.items():
        (workspace / "files" / path).parent.mkdir(parents=True, exist_ok=True)
        (workspace / "files" / path).write_text(content, encoding="utf-8")
    hidden = directory / "hidden"
    hidden.mkdir(parents=True)
    shutil.copyfile(GRADE_SCRIPT, hidden / "grade.py")
    (hidden / "check.json").write_text(_dump(task.check), encoding="utf-8")
    (hidden / "seed.json").write_text(_dump({"state": task.state, "files": task.files}), encoding="utf-8")
    (directory / "task.yaml").write_text(task_yaml(task, config, split), encoding="utf-8")
    return directory


def generate(config: ClawConfig, out: Path, *, overwrite: bool = False) -> dict[Split, list[ClawTask]]:
    """Write both splits, the solutions and ``manifest.json`` under ``out``; refuses a non-empty ``out`` unless
    ``overwrite``."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"output directory {out} is not empty (pass overwrite=True / --overwrite)")
        shutil.rmtree(out)
    splits = generate_tasks(config)
    for split, tasks in splits.items():
        for task in tasks:
            write_task(task, config, split, out / split / task.task_id)
            solution = out / SOLUTIONS_DIR / split / f"{task.task_id}.json"
            solution.parent.mkdir(parents=True, exist_ok=True)
            solution.write_text(_dump(task.solutions()), encoding="utf-8")
    manifest = {
        "recipe": "claw",
        "config": config.model_dump(),
        "splits": {split: [task.task_id for task in tasks] for split, tasks in splits.items()},
        "kinds": {task.task_id: task.kind for tasks in splits.values() for task in tasks},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log.info("claw tasks written", out=str(out), **{split: len(tasks) for split, tasks in splits.items()})
    return splits


def load_solutions(out: Path, split: Split, task_id: str) -> JSON:
    """The solutions file of a generated task."""
    return json.loads((out / SOLUTIONS_DIR / split / f"{task_id}.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.claw.tasks OUT [options]``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.claw.tasks", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="Output directory (train/, eval/, solutions/, manifest.json).")
    add_model_options(parser, ClawConfig)
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty output directory.")
    args = parser.parse_args(argv)
    generate(model_from_options(args, ClawConfig), args.out, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
