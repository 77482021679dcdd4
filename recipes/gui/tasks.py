"""The GUI task suite: a deterministic generator of Orchard task directories over the three apps.

Ten families, each task with its own seeded world (``world.build_world``), so answers differ from task to task:

=====================  ===========================================================================  =============
family                 what the agent must do                                                       graded on
=====================  ===========================================================================  =============
``shop_cheapest``      add the cheapest in-stock product of a category with a minimum rating        cart
``shop_checkout``      buy N of the highest-rated product of a category under a price, express       order
``shop_price``         answer the price of a brand's cheapest in-stock product of a category       answer, no order
``booking_slot``       book a given room, day, time, length, guests and name                       new booking
``booking_earliest``   book the earliest free hour of a room on a day                              new booking
``booking_smallest``   book the smallest room that seats N and is free at a time                   new booking
``booking_cancel``     cancel one of the user's two bookings, keep the other                       bookings
``docs_setting``       answer a setting's default value from the docs                              answer
``docs_error``         answer the error code reported in a situation                               answer
``docs_release``       answer the version that introduced a feature                                answer
=====================  ===========================================================================  =============

Each family has ``train_per_family`` + ``eval_per_family`` tasks (default 5 + 2: 70 tasks); eval tasks draw their
worlds from their own seeds, so no eval world appears in train. A task directory::

    <split>/<task_id>/task.yaml
                     /workspace/.gui/seed.json          the world the apps server starts from
                     /hidden/grade.py, expected.json, seed.json   the grader and its own copy of the world

Reference solutions (browser actions: the agent's tool calls, elements named by their exact accessible names; and
the equivalent HTTP requests, for fast grader tests) are written to ``OUT/references/<task_id>.json``, outside the
task directories. ``wrong`` holds HTTP requests (or an answer) a grader must reject.

Run: ``python -m recipes.gui.tasks OUT [--seed 0] [--train-per-family 5] [--eval-per-family 2]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from recipes.gui.apps.booking import taken, window_days
from recipes.gui.apps.core import money
from recipes.gui.world import CATEGORIES, ROOMS, build_world
from recipes.model_options import add_model_options, model_from_options

GRADER_SOURCE = Path(__file__).resolve().parent / "grade.py"
GRADE_COMMAND = 'python3 -I "$ORCHARD_GRADER_DIR/grade.py"'
"""The Env places ``hidden/`` in ``$ORCHARD_GRADER_DIR``; ``-I`` keeps the working copy off the grader's path."""
APPS_DIR = ".gui"
NAMES = ("Ada Park", "Ben Ortiz", "Chloe Wu", "Dev Rao", "Eva Lind", "Finn Hale")
ADDRESSES = ("12 Elm Street, Springfield", "4 Harbour Road, Bayview", "77 Hill Lane, Oakridge")
LIMITS = {
    "memory_mb": 4096, "address_space_mb": 4 * 1024 * 1024, "processes": 4096, "open_files": 4096, "cpu_seconds": 900,
}  # fmt: skip
"""Chromium's V8 reserves ~1 TiB of address space it never touches: each process's address-space rlimit
(``address_space_mb``) must exceed it, while the sandbox's memory (``memory_mb``, its cgroup) stays 4 GiB."""
Action = dict[str, Any]
Http = tuple[str, str, dict[str, str]]


class SuiteConfig(BaseModel):
    """What to generate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="Seed of every task's world and parameters.")
    train_per_family: int = Field(5, ge=0, description="Train tasks per family.")
    eval_per_family: int = Field(2, ge=0, description="Held-out tasks per family.")
    max_steps: int = Field(20, ge=2, description="Model calls the harness may make.")
    harness_timeout_s: float = Field(300.0, gt=0)
    grade_timeout_s: float = Field(30.0, gt=0)


@dataclass
class GuiTask:
    """One task: its world, instruction, the grader's expectation, a reference and a wrong solution."""

    task_id: str
    family: str
    split: str
    world: dict[str, Any]
    instruction: str
    expected: dict[str, Any]
    actions: list[Action]
    http: list[Http]
    wrong_http: list[Http] = field(default_factory=list)
    wrong_answer: str | None = None

    @property
    def answer(self) -> str:
        """What the reference's ``answer`` call submits."""
        return str(self.actions[-1]["arguments"]["text"])


def act(tool: str, **arguments: Any) -> Action:
    """One browser action (a tool call of ``recipes.gui.agent``)."""
    return {"tool": tool, "arguments": arguments}


# ---------------------------------------------------------------------------------------------------- shop
def _cheapest(products: list[dict[str, Any]]) -> dict[str, Any]:
    return min(products, key=lambda p: (p["price"], p["name"]))


def shop_cheapest(rng: random.Random, world: dict[str, Any]) -> dict[str, Any] | None:
    """Add the cheapest in-stock product of a category rated at least R to the cart."""
    category, rating = rng.choice(sorted(CATEGORIES)), rng.choice((3.0, 3.5, 4.0))
    pool = [
        p for p in world["shop"]["products"] if p["category"] == category and p["in_stock"] and p["rating"] >= rating
    ]
    if len(pool) < 2:
        return None
    target = _cheapest(pool)
    second = _cheapest([p for p in pool if p is not target])
    label = CATEGORIES[category].lower()
    query = f"/shop?category={category}&min_rating={rating:g}&in_stock=1&sort=price_asc"
    return {
        "instruction": f"In the shop, add the cheapest in-stock {label} rated {rating:g} stars or more to the cart "
        "(quantity 1). Put nothing else in the cart and do not check out. Then call answer with 'done'.",
        "expected": {"kind": "cart", "cart": [{"sku": target["sku"], "qty": 1}]},
        "actions": [
            act("navigate", url=query),
            act("click", element=f"Add {target['name']} to cart"),
            act("answer", text="done"),
        ],  # fmt: skip
        "http": [("POST", "/shop/cart/add", {"sku": target["sku"]})],
        "wrong_http": [("POST", "/shop/cart/add", {"sku": second["sku"]})],
    }


def shop_checkout(rng: random.Random, world: dict[str, Any]) -> dict[str, Any] | None:
    """Buy N of the highest-rated in-stock product of a category under a price, with express shipping."""
    category, qty = rng.choice(sorted(CATEGORIES)), rng.randrange(2, 4)
    limit = rng.choice((40, 60, 80))
    pool = [
        p
        for p in world["shop"]["products"]
        if p["category"] == category and p["in_stock"] and p["price"] <= limit * 100
    ]
    ranked = sorted(pool, key=lambda p: (-p["rating"], p["price"]))
    if len(ranked) < 2 or ranked[0]["rating"] == ranked[1]["rating"]:
        return None
    target, name, address = ranked[0], rng.choice(NAMES), rng.choice(ADDRESSES)
    label = CATEGORIES[category].lower()
    form = {"name": name, "address": address, "shipping": "express"}
    return {
        "instruction": f"Buy {qty} of the highest-rated in-stock {label} that costs at most ${limit}. Check out with "
        f"express shipping, full name {name}, address {address}. Then call answer with 'done'.",
        "expected": {"kind": "order", "lines": [{"sku": target["sku"], "qty": qty}], **form},
        "actions": [
            act("navigate", url="/shop"),
            act("type", element="Category", text=category),
            act("type", element="Max price ($)", text=str(limit)),
            act("type", element="In stock only", text="true"),
            act("type", element="Sort by", text="Rating: high to low"),
            act("click", element="Apply filters"),
            act("click", element=target["name"]),
            act("type", element="Quantity", text=str(qty)),
            act("click", element="Add to cart"),
            act("click", element="Checkout"),
            act("type", element="Full name", text=name),
            act("type", element="Address", text=address),
            act("click", element="Express (1-2 days) $15.00"),
            act("click", element="Place order"),
            act("answer", text="done"),
        ],  # fmt: skip
        "http": [
            ("POST", "/shop/cart/add", {"sku": target["sku"], "qty": str(qty)}),
            ("POST", "/shop/checkout", form),
        ],  # fmt: skip
        "wrong_http": [
            ("POST", "/shop/cart/add", {"sku": target["sku"], "qty": str(qty)}),
            ("POST", "/shop/checkout", {**form, "shipping": "standard"}),
        ],  # fmt: skip
    }


def shop_price(rng: random.Random, world: dict[str, Any]) -> dict[str, Any] | None:
    """Answer the price of a brand's cheapest in-stock product of a category."""
    products = world["shop"]["products"]
    pairs = sorted({(p["brand"], p["category"]) for p in products if p["in_stock"]})
    brand, category = rng.choice(pairs)
    pool = [p for p in products if p["brand"] == brand and p["category"] == category and p["in_stock"]]
    target, label = _cheapest(pool), CATEGORIES[category].lower()
    price = money(target["price"])
    return {
        "instruction": f"What is the price of the cheapest in-stock {brand} {label} in the shop? Do not buy anything. "
        "Call answer with the price only, like $12.34.",
        "expected": {"kind": "answer", "answer": price, "match": "money", "no_orders": True},
        "actions": [
            act("navigate", url="/shop"),
            act("type", element="Search", text=f"{brand} {CATEGORIES[category]}"),
            act("type", element="In stock only", text="true"),
            act("type", element="Sort by", text="Price: low to high"),
            act("click", element="Apply filters"),
            act("answer", text=price),
        ],  # fmt: skip
        "http": [],
        "wrong_answer": money(target["price"] + 100),
    }


# ---------------------------------------------------------------------------------------------------- booking
def _free(booking: dict[str, Any], room: str, day: str, start: int, hours: int) -> bool:
    return start + hours <= booking["close_hour"] and not taken(booking, room, day) & set(range(start, start + hours))


def _open_days(booking: dict[str, Any]) -> list[str]:
    return [d.isoformat() for d in window_days(booking) if d.weekday() not in booking["closed_weekdays"]]


def _weekday(day: str) -> str:
    return dt.date.fromisoformat(day).strftime("%A")


def _book_actions(room_label: str, day: str, start: int, hours: int, guests: int, name: str) -> list[Action]:
    return [
        act("navigate", url="/booking"), act("type", element="Room", text=room_label),
        act("type", element="Date", text=day), act("type", element="Start time", text=f"{start:02d}:00"),
        act("type", element="Duration", text=f"{hours} hour{'s' if hours > 1 else ''}"),
        act("type", element="Guests", text=str(guests)), act("type", element="Your name", text=name),
        act("click", element="I accept the cancellation policy"), act("click", element="Book"),
    ]  # fmt: skip


def _book_http(room: str, day: str, start: int, hours: int, guests: int, name: str) -> Http:
    form = {"resource": room, "date": day, "start": str(start), "hours": str(hours), "guests": str(guests)}
    return ("POST", "/booking/book", {**form, "name": name, "accept": "1"})


def _room_label(room: str) -> str:
    return next(f"{name} (seats {cap})" for rid, name, cap in ROOMS if rid == room)


def _booking_task(room: str, day: str, start: int, hours: int, guests: int, name: str, text: str) -> dict[str, Any]:
    spec = {"resource": room, "date": day, "start": start, "hours": hours, "guests": guests, "name": name}
    return {
        "instruction": text + " Then call answer with 'done'.",
        "expected": {"kind": "booking", "booking": spec},
        "actions": [*_book_actions(_room_label(room), day, start, hours, guests, name), act("answer", text="done")],
        "http": [_book_http(room, day, start, hours, guests, name)],
    }


def booking_slot(rng: random.Random, world: dict[str, Any]) -> dict[str, Any] | None:
    """Book a given room, day, time, length, guests and name."""
    booking = world["booking"]
    rid, label, cap = rng.choice(ROOMS)
    day, hours = rng.choice(_open_days(booking)), rng.choice((1, 2))
    free = [h for h in range(booking["open_hour"], booking["close_hour"]) if _free(booking, rid, day, h, hours)]
    if not free:
        return None
    start, guests, name = rng.choice(free), rng.randrange(1, cap + 1), rng.choice(NAMES)
    plural = "s" if hours > 1 else ""
    text = (f"Book the {label} on {_weekday(day)} {day} from {start:02d}:00 for {hours} hour{plural}, "
            f"{guests} guest{'s' if guests > 1 else ''}, under the name {name}.")  # fmt: skip
    task = _booking_task(rid, day, start, hours, guests, name, text)
    later = next((h for h in free if h != start), None)
    task["wrong_http"] = [_book_http(rid, day, later, hours, guests, name)] if later is not None else []
    return task if later is not None else None


def booking_earliest(rng: random.Random, world: dict[str, Any]) -> dict[str, Any] | None:
    """Book the earliest free hour of a room on a day."""
    booking = world["booking"]
    rid, label, cap = rng.choice(ROOMS)
    day = rng.choice(_open_days(booking))
    free = [h for h in range(booking["open_hour"], booking["close_hour"]) if _free(booking, rid, day, h, 1)]
    if len(free) < 2 or free[0] == booking["open_hour"] and rng.random() < 0.7:
        return None  # prefer days where the first hours are taken: the agent must look at availability
    guests, name = rng.randrange(1, cap + 1), rng.choice(NAMES)
    text = (f"Book the earliest free one-hour slot in the {label} on {_weekday(day)} {day} for {guests} "
            f"guest{'s' if guests > 1 else ''}, under the name {name}.")  # fmt: skip
    task = _booking_task(rid, day, free[0], 1, guests, name, text)
    check = [act("navigate", url="/booking"), act("type", element="Room to check", text=_room_label(rid)),
             act("type", element="Day to check", text=day), act("click", element="Show availability")]  # fmt: skip
    task["actions"] = check + task["actions"]
    task["wrong_http"] = [_book_http(rid, day, free[1], 1, guests, name)]
    return task


def booking_smallest(rng: random.Random, world: dict[str, Any]) -> dict[str, Any] | None:
    """Book the smallest room that seats N guests and is free at a given time."""
    booking = world["booking"]
    guests, day = rng.randrange(2, 9), rng.choice(_open_days(booking))
    start = rng.randrange(booking["open_hour"], booking["close_hour"] - 1)
    fits = [(cap, rid) for rid, _, cap in ROOMS if cap >= guests and _free(booking, rid, day, start, 1)]
    seats = sorted(cap for _, _, cap in ROOMS if cap >= guests)
    if len(fits) < 2 or min(fits)[0] == seats[0] and rng.random() < 0.5:
        return None  # prefer cases where the smallest fitting room is taken
    room, name = min(fits)[1], rng.choice(NAMES)
    text = (f"Book the smallest room that seats {guests} guests and is free on {_weekday(day)} {day} from "
            f"{start:02d}:00 for one hour, under the name {name}.")  # fmt: skip
    task = _booking_task(room, day, start, 1, guests, name, text)
    task["wrong_http"] = [_book_http(max(fits)[1], day, start, 1, guests, name)]
    return task


def booking_cancel(rng: random.Random, world: dict[str, Any]) -> dict[str, Any] | None:
    """Cancel one of the user's two bookings and keep the other."""
    mine = [b for b in world["booking"]["bookings"] if b["mine"]]
    if len(mine) != 2:
        return None
    drop, keep = rng.sample(mine, 2)
    room = _room_label(drop["resource"]).split(" (")[0]
    return {
        "instruction": f"Cancel my booking of the {room} on {drop['date']} at {drop['start']:02d}:00. Keep my other "
        "bookings. Then call answer with 'done'.",
        "expected": {"kind": "cancel", "cancelled": drop["code"], "kept": [keep["code"]]},
        "actions": [
            act("navigate", url="/booking/mine"),
            act("click", element=f"Cancel booking {drop['code']}"),
            act("answer", text="done"),
        ],  # fmt: skip
        "http": [("POST", "/booking/cancel", {"code": drop["code"]})],
        "wrong_http": [("POST", "/booking/cancel", {"code": keep["code"]})],
    }


# ---------------------------------------------------------------------------------------------------- docs
def _docs_task(question: str, answer: str, wrong: str, search: str, page: str) -> dict[str, Any]:
    return {
        "instruction": f"Use the Orchid documentation site. {question} Call answer with the answer only.",
        "expected": {"kind": "answer", "answer": answer, "match": "text"},
        "actions": [
            act("navigate", url="/docs"),
            act("type", element="Search docs", text=search, submit=True),
            act("click", element=page),
            act("answer", text=answer),
        ],  # fmt: skip
        "http": [],
        "wrong_answer": wrong,
    }


def docs_setting(rng: random.Random, world: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any] | None:
    """The default value of a setting."""
    settings = facts["settings"]
    name, other = rng.sample(sorted(settings), 2)
    page = next(p["title"] for p in world["docs"]["pages"] if any(f"Setting {name}:" in t for t in p["body"]))
    if settings[name] == settings[other]:
        return None
    question = f"What is the default value of the {name} setting?"
    return _docs_task(question, str(settings[name]), str(settings[other]), name, page)


def docs_error(rng: random.Random, world: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any] | None:
    """The error code reported in a situation."""
    meaning, other = rng.sample(sorted(facts["errors"]), 2)
    question = f"Which error code does Orchid report when {meaning}?"
    return _docs_task(question, facts["errors"][meaning], facts["errors"][other], meaning.split()[-1], "Error codes")


def docs_release(rng: random.Random, world: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any] | None:
    """The version that introduced a feature."""
    feature, other = rng.sample(sorted(facts["releases"]), 2)
    question = f"In which Orchid version was {feature} introduced? Answer with the version number, like 1.2."
    return _docs_task(question, facts["releases"][feature], facts["releases"][other], feature, "Release notes")


FAMILIES: dict[str, tuple[str, Callable[..., dict[str, Any] | None]]] = {
    "shop_cheapest": ("/shop", shop_cheapest), "shop_checkout": ("/shop", shop_checkout),
    "shop_price": ("/shop", shop_price), "booking_slot": ("/booking", booking_slot),
    "booking_earliest": ("/booking", booking_earliest), "booking_smallest": ("/booking", booking_smallest),
    "booking_cancel": ("/booking/mine", booking_cancel), "docs_setting": ("/docs", docs_setting),
    "docs_error": ("/docs", docs_error), "docs_release": ("/docs", docs_release),
}  # fmt: skip
"""Family -> (start page, builder)."""


def make_task(family: str, split: str, index: int, seed: int) -> GuiTask:
    """Task ``index`` of ``family`` in ``split``: the first world (from its own seed stream) the builder accepts."""
    start, builder = FAMILIES[family]
    for attempt in range(1000):
        key = f"{seed}:{split}:{family}:{index}:{attempt}"
        world = build_world(key, start)
        facts = world["docs"].pop("facts")
        rng = random.Random(f"orchard-gui-task:{key}")  # noqa: S311 - task data
        built = builder(rng, world, facts) if family.startswith("docs_") else builder(rng, world)
        if built is not None:
            task_id = f"gui-{family.replace('_', '-')}-{split}-{index:03d}"
            return GuiTask(task_id=task_id, family=family, split=split, world=world, **built)
    raise RuntimeError(f"no feasible {family} task after 1000 worlds")  # pragma: no cover


def generate_tasks(config: SuiteConfig) -> list[GuiTask]:
    """Every task of both splits, family by family."""
    counts = {"train": config.train_per_family, "eval": config.eval_per_family}
    return [
        make_task(family, split, index, config.seed)
        for split, count in counts.items()
        for family in FAMILIES
        for index in range(count)
    ]


def write_task(task: GuiTask, config: SuiteConfig, directory: Path) -> Path:
    """One task directory (workspace seed, hidden grader) — the reference stays out of it."""
    (directory / "workspace" / APPS_DIR).mkdir(parents=True)
    (directory / "workspace" / APPS_DIR / "seed.json").write_text(json.dumps(task.world, indent=1, sort_keys=True))
    hidden = directory / "hidden"
    hidden.mkdir(parents=True)
    shutil.copyfile(GRADER_SOURCE, hidden / "grade.py")
    (hidden / "seed.json").write_text(json.dumps(task.world, indent=1, sort_keys=True))
    (hidden / "expected.json").write_text(json.dumps(task.expected, indent=1, sort_keys=True) + "\n")
    spec = {
        "task_id": task.task_id, "instruction": task.instruction, "grade_command": GRADE_COMMAND,
        "grade_timeout_s": config.grade_timeout_s, "harness_timeout_s": config.harness_timeout_s,
        "max_steps": config.max_steps, "limits": LIMITS,
        "labels": {"recipe": "gui", "family": task.family, "split": task.split, "app": task.family.split("_")[0]},
    }  # fmt: skip
    (directory / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return directory


def reference_record(task: GuiTask) -> dict[str, Any]:
    """What ``references/<task_id>.json`` holds."""
    record = asdict(task)
    del record["world"], record["split"]
    return record


def generate(config: SuiteConfig, out: Path, *, overwrite: bool = False) -> list[GuiTask]:
    """Write ``out/train``, ``out/eval``, ``out/references`` and ``out/manifest.json``."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"output directory {out} is not empty (pass overwrite=True / --overwrite)")
        shutil.rmtree(out)
    tasks = generate_tasks(config)
    (out / "references").mkdir(parents=True)
    for task in tasks:
        write_task(task, config, out / task.split / task.task_id)
        (out / "references" / f"{task.task_id}.json").write_text(json.dumps(reference_record(task), indent=1) + "\n")
    splits = {split: [t.task_id for t in tasks if t.split == split] for split in ("train", "eval")}
    manifest = {"recipe": "gui", "config": config.model_dump(), "splits": splits}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return tasks


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.gui.tasks OUT [options]``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.gui.tasks", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    add_model_options(parser, SuiteConfig)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    tasks = generate(model_from_options(args, SuiteConfig), args.out, overwrite=args.overwrite)
    print(f"wrote {len(tasks)} tasks to {args.out}")  # noqa: T201 - command-line output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
