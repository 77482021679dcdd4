"""The GUI grader: run over the episode's working copy after the harness exits; standard library only.

The generator ships this file at the top of every task's ``hidden/`` with ``expected.json`` (what must be true) and
``seed.json`` (the world the episode started from: the grader's own copy, so nothing the agent did can change it).
Once the agent is gone the Env places them in a read-only directory outside the working copy
(``$ORCHARD_GRADER_DIR``) and runs ``python3 -I "$ORCHARD_GRADER_DIR/grade.py"`` in the working copy, which is input
only: nothing of it is imported or run. It reads the apps' final state (``.gui/state.json``; the seed when the apps
never started; a state file that is not a JSON object fails the grade with ``state_readable`` 0) and the submitted
answer (``answer.txt``), writes ``$ORCHARD_GRADER_OUT/signals.json`` and exits 0 only on success. Every check is on
state or answer, never on the agent's text. ``progress`` (in [0, 1]) is the partial credit; the other signals are 0
or 1:

==========  ==============================================================================================
kind        signals (success needs all of them)
==========  ==============================================================================================
cart        ``cart_has_target`` the right product is in the cart; ``cart_exact`` the cart is exactly the
            expected lines; ``no_order`` nothing was bought
order       ``order_placed`` exactly one order; ``right_items``; ``right_shipping``; ``right_recipient``
answer      ``answered``; ``answer_correct`` (money compared in cents, text case- and punctuation-insensitive);
            ``no_side_effects`` no order placed, no booking made or cancelled
booking     ``booked`` a new booking exists; ``right_room``, ``right_time``, ``right_party`` (guests and name)
            of the best new booking; ``single_booking`` exactly one new; ``seeded_intact`` no other booking
            touched
cancel      ``cancelled`` the booking is gone; ``kept`` the others are there; ``no_new_bookings``
==========  ==============================================================================================
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STATE, SEED, ANSWER = Path(".gui/state.json"), HERE / "seed.json", Path("answer.txt")
OUT_ENV, SIGNALS_NAME = "ORCHARD_GRADER_OUT", "signals.json"
MAX_ANSWER_BYTES, MAX_STATE_BYTES = 4096, 64 * 1024 * 1024
UNREADABLE = {"state_readable": 0.0, "success": 0.0, "progress": 0.0}
"""The signals when ``.gui/state.json`` is there but not a JSON object."""
Signals = dict[str, float]


def normalise(text: str) -> str:
    """Answer text compared case- and punctuation-insensitively.

    >>> normalise(" `E417`. "), normalise("Version 2.3")
    ('e417', 'version 2.3')
    """
    return re.sub(r"\s+", " ", text.strip().strip("`'\".").casefold())


def cents(text: str) -> int | None:
    """A price in cents.

    >>> cents("$12.50"), cents("12.5 dollars"), cents("free")
    (1250, 1250, None)
    """
    match = re.search(r"\d+(?:\.\d{1,2})?", text.replace(",", ""))
    return None if match is None else round(float(match.group()) * 100)


def _bookings(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["code"]: b for b in state["booking"]["bookings"]}


def grade_cart(expected: dict[str, Any], seed: dict[str, Any], state: dict[str, Any], answer: str | None) -> Signals:
    """The cart holds exactly the expected lines and nothing was bought."""
    cart = sorted((line["sku"], line["qty"]) for line in state["shop"]["cart"])
    wanted = sorted((line["sku"], line["qty"]) for line in expected["cart"])
    has = float(all(sku in {s for s, _ in cart} for sku, _ in wanted))
    signals = {
        "cart_has_target": has,
        "cart_exact": float(cart == wanted),
        "no_order": float(not state["shop"]["orders"]),
    }
    return signals | {"progress": 0.5 * has + 0.3 * signals["cart_exact"] + 0.2 * signals["no_order"]}


def grade_order(expected: dict[str, Any], seed: dict[str, Any], state: dict[str, Any], answer: str | None) -> Signals:
    """Exactly one order, of the expected lines, shipping and recipient."""
    orders = state["shop"]["orders"]
    order = orders[-1] if orders else {"lines": [], "shipping": None, "name": "", "address": ""}
    lines = sorted((line["sku"], line["qty"]) for line in order["lines"])
    signals = {
        "order_placed": float(len(orders) == 1),
        "right_items": float(lines == sorted((line["sku"], line["qty"]) for line in expected["lines"])),
        "right_shipping": float(order["shipping"] == expected["shipping"]),
        "right_recipient": float(
            normalise(order["name"]) == normalise(expected["name"])
            and normalise(order["address"]) == normalise(expected["address"])
        ),
    }
    in_cart = any(line["sku"] == expected["lines"][0]["sku"] for line in state["shop"]["cart"])
    progress = sum(signals.values()) / 4 if orders else 0.25 * in_cart
    return signals | {"progress": progress}


def grade_answer(expected: dict[str, Any], seed: dict[str, Any], state: dict[str, Any], answer: str | None) -> Signals:
    """The answer is right, and nothing was bought or booked."""
    text = answer or ""
    if expected["match"] == "money":
        correct = cents(text) is not None and cents(text) == cents(expected["answer"])
    else:
        correct = normalise(text) == normalise(expected["answer"])
    untouched = not state["shop"]["orders"] and _bookings(state) == _bookings(seed)
    signals = {
        "answered": float(bool(text.strip())),
        "answer_correct": float(correct),
        "no_side_effects": float(untouched),
    }
    return signals | {"progress": 0.8 * correct + 0.2 * untouched if text.strip() else 0.0}


def grade_booking(expected: dict[str, Any], seed: dict[str, Any], state: dict[str, Any], answer: str | None) -> Signals:
    """Exactly one new booking, as specified, and every other booking as it was."""
    before, after = _bookings(seed), _bookings(state)
    new = [b for code, b in after.items() if code not in before]
    want = expected["booking"]

    def checks(b: dict[str, Any]) -> tuple[float, float, float]:
        return (
            float(b["resource"] == want["resource"]),
            float((b["date"], b["start"], b["hours"]) == (want["date"], want["start"], want["hours"])),
            float(b["guests"] == want["guests"] and normalise(b["name"]) == normalise(want["name"])),
        )

    best = max((checks(b) for b in new), key=sum, default=(0.0, 0.0, 0.0))
    intact = all(after.get(code) == b for code, b in before.items())
    signals = {"booked": float(bool(new)), "right_room": best[0], "right_time": best[1], "right_party": best[2],
               "single_booking": float(len(new) == 1), "seeded_intact": float(intact)}  # fmt: skip
    progress = (0.25 * bool(new) + 0.25 * sum(best)) * (1.0 if len(new) <= 1 and intact else 0.5)
    return signals | {"progress": progress}


def grade_cancel(expected: dict[str, Any], seed: dict[str, Any], state: dict[str, Any], answer: str | None) -> Signals:
    """The named booking is gone; the others remain; nothing new was booked."""
    before, after = _bookings(seed), _bookings(state)
    signals = {
        "cancelled": float(expected["cancelled"] not in after),
        "kept": float(all(after.get(code) == b for code, b in before.items() if code != expected["cancelled"])),
        "no_new_bookings": float(set(after) <= set(before)),
    }
    return signals | {"progress": sum(signals.values()) / 3 if signals["cancelled"] else 0.0}


GRADERS: dict[str, Callable[[dict[str, Any], dict[str, Any], dict[str, Any], str | None], Signals]] = {
    "cart": grade_cart, "order": grade_order, "answer": grade_answer, "booking": grade_booking, "cancel": grade_cancel,
}  # fmt: skip


def grade(expected: dict[str, Any], seed: dict[str, Any], state: dict[str, Any], answer: str | None) -> Signals:
    """Every signal of the episode, ``success`` (1 when all the kind's checks hold) among them."""
    signals = GRADERS[expected["kind"]](expected, seed, state, answer)
    checks = [value for name, value in signals.items() if name != "progress"]
    success = float(all(value == 1.0 for value in checks))
    return signals | {"success": success, "progress": 1.0 if success else min(signals["progress"], 0.9)}


def within_working_copy(path: Path) -> bool:
    """Whether ``path``, links resolved, is inside the working copy (an answer linked to ``expected.json`` is not)."""
    try:
        path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return False
    return True


def read_input(path: Path, limit: int) -> bytes | None:
    """The first ``limit`` bytes of a working-copy file, ``None`` when it is not a readable regular file of the
    working copy (a FIFO or device would block or never end; a link may point at the grader's own files)."""
    if not path.is_file() or not within_working_copy(path):
        return None
    try:
        with path.open("rb") as handle:
            return handle.read(limit)
    except OSError:
        return None


def read_state(seed: dict[str, Any]) -> dict[str, Any] | None:
    """The apps' final state: the seed when there is none (the apps never started), ``None`` when it is there but
    not a readable JSON object (unreadable state must not hide what the agent did)."""
    if not STATE.exists() and not STATE.is_symlink():
        return seed
    data = read_input(STATE, MAX_STATE_BYTES)
    try:
        state = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def signals_path() -> Path:
    """``$ORCHARD_GRADER_OUT/signals.json``; exits with an error naming the variable when it is not set."""
    out = os.environ.get(OUT_ENV)
    if not out:
        raise SystemExit(f"grade: {OUT_ENV} is not set (the Env's Sandbox.run_grader sets it)")
    return Path(out) / SIGNALS_NAME


def main() -> int:
    """Grade the working copy; exit 0 on success."""
    target = signals_path()
    expected = json.loads((HERE / "expected.json").read_text(encoding="utf-8"))
    seed = json.loads(SEED.read_text(encoding="utf-8"))
    raw = read_input(ANSWER, MAX_ANSWER_BYTES)
    answer = raw.decode("utf-8", errors="replace") if raw is not None else None
    state = read_state(seed)
    signals = grade(expected, seed, state, answer) if state is not None else UNREADABLE
    target.write_text(json.dumps(signals, sort_keys=True) + "\n", encoding="utf-8")
    sys.stdout.write(json.dumps(signals, sort_keys=True) + "\n")
    return 0 if signals["success"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
