"""Seeded worlds of the GUI apps: a shop catalogue, a booking calendar and a docs site, one per task.

``build_world(seed)`` is a pure function of its seed: the JSON state the apps server starts from (``seed.json``).
Every task gets its own world, so prices, ratings, free slots and documented values differ from task to task and an
answer cannot be memorised across tasks.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

CATEGORIES = {"kettle": "Kettle", "headphones": "Headphones", "backpack": "Backpack", "lamp": "Desk Lamp",
              "mug": "Travel Mug", "bottle": "Water Bottle"}  # fmt: skip
BRANDS = ("Acme", "Borealis", "Cobalt", "Dune", "Ember", "Fjord")
ADJECTIVES = ("Classic", "Compact", "Deluxe", "Eco", "Pro", "Ultra", "Mini", "Smart", "Steel", "Nova")
ROOMS = (("alder", "Alder Room", 2), ("birch", "Birch Room", 4), ("cedar", "Cedar Room", 6),
         ("delta", "Delta Hall", 12))  # fmt: skip
FIRST_MONDAY = dt.date(2026, 3, 2)
OPEN_HOUR, CLOSE_HOUR = 9, 18
SETTINGS = (("retry_limit", "Times a failed sync is retried", "network"),
            ("timeout_seconds", "Seconds before a request is abandoned", "network"),
            ("chunk_size_kb", "Size of an upload chunk in KiB", "storage"),
            ("cache_days", "Days a cached object is kept", "storage"),
            ("max_workers", "Parallel transfer workers", "performance"),
            ("log_rotate_mb", "Log size that triggers rotation, MiB", "logging"),
            ("keep_logs", "Rotated log files kept", "logging"),
            ("lock_wait_seconds", "Seconds to wait for the repository lock", "performance"))  # fmt: skip
ERRORS = ("the repository lock is held by another process", "the remote rejects the credentials",
          "a chunk fails its checksum", "the local disk is full", "the configuration file cannot be parsed",
          "the remote is unreachable", "a file changed while it was uploaded")  # fmt: skip
FEATURES = ("resumable uploads", "the dry-run mode", "shell completion", "encrypted caches", "bandwidth limits",
            "the watch command", "JSON output", "proxy support")  # fmt: skip
SECTIONS = {"network": "Network settings", "storage": "Storage settings", "performance": "Performance tuning",
            "logging": "Logging"}  # fmt: skip


def build_world(seed: str, start_path: str = "/") -> dict[str, Any]:
    """The apps' initial state for ``seed``."""
    rng = random.Random(f"orchard-gui-world:{seed}")  # noqa: S311 - task data, not secrets
    return {
        "version": 1,
        "start_path": start_path,
        "shop": _shop(rng),
        "booking": _booking(rng),
        "docs": _docs(rng),
    }


def _shop(rng: random.Random) -> dict[str, Any]:
    products = []
    for code, label in CATEGORIES.items():
        names: set[str] = set()
        prices = rng.sample(range(8, 120), 8)  # distinct whole-dollar prices in a category: no ties
        for index, dollars in enumerate(prices):
            brand, adjective = rng.choice(BRANDS), rng.choice(ADJECTIVES)
            while f"{brand} {adjective} {label}" in names:
                brand, adjective = rng.choice(BRANDS), rng.choice(ADJECTIVES)
            names.add(name := f"{brand} {adjective} {label}")
            products.append({
                "sku": f"{code}-{index + 1:02d}", "name": name, "category": code, "brand": brand,
                "price": dollars * 100 + rng.choice((0, 49, 99)), "rating": rng.randrange(25, 51) / 10,
                "in_stock": rng.random() < 0.8, "description": f"A {adjective.lower()} {label.lower()} by {brand}.",
            })  # fmt: skip
    rng.shuffle(products)
    return {"products": products, "cart": [], "orders": [], "next_order": 1001}


def _booking(rng: random.Random) -> dict[str, Any]:
    start = FIRST_MONDAY + dt.timedelta(weeks=rng.randrange(0, 30))
    days = [start + dt.timedelta(days=i) for i in range(7)]
    bookings: list[dict[str, Any]] = []
    for code in range(rng.randrange(14, 22)):
        room, day = rng.choice(ROOMS), rng.choice(days[:6])
        hour, hours = rng.randrange(OPEN_HOUR, CLOSE_HOUR - 1), rng.choice((1, 1, 2))
        if any(b["resource"] == room[0] and b["date"] == day.isoformat() and
               b["start"] < hour + hours and hour < b["start"] + b["hours"] for b in bookings):  # fmt: skip
            continue
        mine = len([b for b in bookings if b["mine"]]) < 2 and rng.random() < 0.3
        bookings.append({
            "code": f"BK-{9000 + code:04d}", "resource": room[0], "date": day.isoformat(), "start": hour,
            "hours": hours, "name": "You" if mine else rng.choice(("Kim", "Ravi", "Lena", "Tom", "Ana")),
            "guests": min(room[2], rng.randrange(1, 5)), "mine": mine,
        })  # fmt: skip
    resources = [{"id": rid, "name": name, "capacity": cap} for rid, name, cap in ROOMS]
    return {
        "window": {"start": start.isoformat(), "days": 7}, "open_hour": OPEN_HOUR, "close_hour": CLOSE_HOUR,
        "closed_weekdays": [6], "resources": resources, "bookings": bookings, "next_code": 1,
    }  # fmt: skip


def _docs(rng: random.Random) -> dict[str, Any]:
    settings = {name: (rng.randrange(2, 97), text, section) for name, text, section in SETTINGS}
    codes = rng.sample(range(100, 999), len(ERRORS))
    versions = sorted(rng.sample([f"{major}.{minor}" for major in (1, 2, 3) for minor in range(10)], len(FEATURES)))
    features = rng.sample(FEATURES, len(FEATURES))
    pages = [
        {
            "slug": "getting-started",
            "title": "Getting started",
            "body": [
                "Orchid keeps a folder in sync with a remote store.",
                "Install it, run orchid init in a folder, then orchid sync.",
                "Settings live in orchid.toml; each page of the configuration reference lists its defaults.",
            ],
        }
    ]
    for section, title in SECTIONS.items():
        body = [f"Setting {name}: {text}. Default: {value}."
                for name, (value, text, where) in settings.items() if where == section]  # fmt: skip
        pages.append({"slug": section, "title": title, "body": body})
    pages.append(
        {
            "slug": "errors",
            "title": "Error codes",
            "body": [f"E{code}: reported when {meaning}." for code, meaning in zip(codes, ERRORS, strict=True)],
        }
    )
    pages.append({"slug": "releases", "title": "Release notes",
                  "body": [f"Version {version} introduced {feature}."
                           for version, feature in zip(versions, features, strict=True)]})  # fmt: skip
    pages.append({"slug": "commands", "title": "Commands",
                  "body": ["orchid sync: upload and download changes.", "orchid status: list pending changes.",
                           "orchid watch: sync continuously."]})  # fmt: skip
    return {
        "product": "Orchid",
        "pages": pages,
        "facts": {"settings": {k: v[0] for k, v in settings.items()},
                  "errors": {meaning: f"E{code}" for code, meaning in zip(codes, ERRORS, strict=True)},
                  "releases": dict(zip(features, versions, strict=True))},
    }  # fmt: skip
