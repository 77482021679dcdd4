"""The booking form: rooms with capacities, a window of bookable days, availability, validation, confirmation.

State (``state["booking"]``): ``window`` (``start`` ISO date, ``days``), ``open_hour``/``close_hour``,
``closed_weekdays`` (0 = Monday), ``resources`` (id, name, capacity), ``bookings`` (code, resource, date, start hour,
hours, name, guests, ``mine``: made by the user, so listed under "My bookings" and cancellable) and ``next_code``.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from recipes.gui.apps.core import AppRouter, Request, Response, State, errors_html, esc, options, page

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def window_days(booking: dict[str, Any]) -> list[dt.date]:
    """Every day of the booking window."""
    start = dt.date.fromisoformat(booking["window"]["start"])
    return [start + dt.timedelta(days=i) for i in range(booking["window"]["days"])]


def taken(booking: dict[str, Any], resource: str, date: str) -> set[int]:
    """Hours of ``resource`` booked on ``date``."""
    return {
        hour
        for b in booking["bookings"]
        if b["resource"] == resource and b["date"] == date
        for hour in range(b["start"], b["start"] + b["hours"])
    }


def validate(booking: dict[str, Any], request: Request) -> list[str]:
    """What is wrong with a booking request (empty when it can be booked)."""
    resources = {r["id"]: r for r in booking["resources"]}
    resource, date_text = resources.get(request.arg("resource")), request.arg("date")
    start, hours, guests = _int(request.arg("start")), _int(request.arg("hours")), _int(request.arg("guests"))
    errors = []
    if resource is None:
        errors.append("Choose a room.")
    date = _date(date_text)
    if date is None or date not in window_days(booking):
        days = window_days(booking)
        errors.append(f"Choose a date from {days[0].isoformat()} to {days[-1].isoformat()}.")
    elif date.weekday() in booking["closed_weekdays"]:
        errors.append(f"We are closed on {WEEKDAYS[date.weekday()]}s.")
    if start is None or hours is None or hours < 1 or not booking["open_hour"] <= start < booking["close_hour"]:
        errors.append("Choose a start time and a duration.")
    elif start + hours > booking["close_hour"]:
        errors.append(f"Bookings must end by {booking['close_hour']}:00.")
    if guests is None or guests < 1:
        errors.append("Enter the number of guests.")
    elif resource is not None and guests > resource["capacity"]:
        errors.append(f"{resource['name']} seats at most {resource['capacity']} guests.")
    if not request.arg("name"):
        errors.append("Enter your name.")
    if not request.arg("accept"):
        errors.append("Accept the cancellation policy.")
    if (
        not errors
        and resource
        and start is not None
        and hours
        and taken(booking, resource["id"], date_text) & set(range(start, start + hours))
    ):
        errors.append(f"{resource['name']} is already booked at that time on {date_text}.")
    return errors


def _int(text: str) -> int | None:
    return int(text) if text.lstrip("-").isdigit() else None


def _date(text: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def form_page(state: State, request: Request, _: re.Match[str], errors: list[str] | None = None) -> Response:
    """Rooms, the availability lookup and the booking form (re-shown with its values and errors)."""
    booking = state["booking"]
    rooms = [(r["id"], f"{r['name']} (seats {r['capacity']})") for r in booking["resources"]]
    days = window_days(booking)
    hours = [(str(h), f"{h:02d}:00") for h in range(booking["open_hour"], booking["close_hour"])]
    durations = [(str(h), f"{h} hour{'s' if h > 1 else ''}") for h in (1, 2, 3)]
    room_rows = "".join(f"<li>{esc(label)}</li>" for _, label in rooms)
    closed = ", ".join(WEEKDAYS[d] for d in booking["closed_weekdays"]) or "never"
    accept = " checked" if request.arg("accept") else ""
    body = (
        f"<h1>Book a room</h1><p>Open {booking['open_hour']:02d}:00 to {booking['close_hour']:02d}:00, "
        f"{days[0].isoformat()} to {days[-1].isoformat()}; closed on: {esc(closed)}.</p><ul>{room_rows}</ul>"
        '<form method="get" action="/booking/availability" aria-label="Availability"><label>Room to check '
        f'<select name="resource">{options(rooms, request.arg("resource"))}</select></label> <label>Day to check '
        f'<input type="date" name="date" value="{esc(request.arg("date"))}"></label> '
        '<button type="submit">Show availability</button></form>'
        f"<h2>New booking</h2>{errors_html(errors or [])}"
        '<form method="post" action="/booking/book" aria-label="New booking">'
        f'<label>Room <select name="resource">{options([("", "Choose a room"), *rooms], request.arg("resource"))}'
        f'</select></label> <label>Date <input type="date" name="date" min="{days[0].isoformat()}" '
        f'max="{days[-1].isoformat()}" value="{esc(request.arg("date"))}"></label> <label>Start time <select '
        f'name="start">{options([("", "Choose"), *hours], request.arg("start"))}</select></label> <label>Duration '
        f'<select name="hours">{options(durations, request.arg("hours", "1"))}</select></label> <label>Guests '
        f'<input type="number" name="guests" min="1" value="{esc(request.arg("guests"))}"></label> <label>Your name '
        f'<input name="name" value="{esc(request.arg("name"))}"></label> <label><input type="checkbox" name="accept" '
        f'value="1"{accept}> I accept the cancellation policy</label> <button type="submit">Book</button></form>'
    )
    return Response(422 if errors else 200, page("Booking", body, state))


def availability_page(state: State, request: Request, match: re.Match[str]) -> Response:
    """Free and booked hours of one room on one day."""
    booking = state["booking"]
    resource, date = request.arg("resource"), request.arg("date")
    names = {r["id"]: r["name"] for r in booking["resources"]}
    parsed = _date(date)
    if resource not in names or parsed is None or parsed not in window_days(booking):
        return form_page(state, request, match, ["Choose a room and a date inside the booking window."])
    busy = taken(booking, resource, date)
    closed = parsed.weekday() in booking["closed_weekdays"]
    rows = "".join(
        f"<tr><td>{h:02d}:00</td><td>{'Closed' if closed else 'Booked' if h in busy else 'Free'}</td></tr>"
        for h in range(booking["open_hour"], booking["close_hour"])
    )
    body = (
        f"<h1>{esc(names[resource])} on {WEEKDAYS[parsed.weekday()]} {esc(date)}</h1><table><thead><tr><th>Time</th>"
        f'<th>Status</th></tr></thead><tbody>{rows}</tbody></table><a href="/booking">Back to booking</a>'
    )
    return Response(200, page("Availability", body, state))


def book(state: State, request: Request, match: re.Match[str]) -> Response:
    """Create a booking, or show the form again with what is wrong."""
    booking = state["booking"]
    errors = validate(booking, request)
    if errors:
        return form_page(state, request, match, errors)
    code = f"BK-{booking['next_code']:04d}"
    booking["next_code"] += 1
    booking["bookings"].append({
        "code": code, "resource": request.arg("resource"), "date": request.arg("date"),
        "start": int(request.arg("start")), "hours": int(request.arg("hours")), "name": request.arg("name"),
        "guests": int(request.arg("guests")), "mine": True,
    })  # fmt: skip
    return Response.redirect(f"/booking/confirmation/{code}")


def confirmation_page(state: State, request: Request, match: re.Match[str]) -> Response:
    """A booking's confirmation."""
    found = next((b for b in state["booking"]["bookings"] if b["code"] == match["code"]), None)
    if found is None:
        return Response(404, page("Not found", "<p>No such booking.</p>", state))
    body = (
        f"<h1>Booking confirmed</h1><p>Code {esc(found['code'])}: {esc(found['resource'])} on {esc(found['date'])} "
        f"from {found['start']:02d}:00 for {found['hours']} h, {found['guests']} guests, name {esc(found['name'])}.</p>"
    )
    return Response(200, page("Booking confirmed", body, state))


def mine_page(state: State, request: Request, _: re.Match[str]) -> Response:
    """The user's bookings, each with a cancel button."""
    rows = "".join(
        f"<tr><td>{esc(b['code'])}</td><td>{esc(b['resource'])}</td><td>{esc(b['date'])}</td>"
        f"<td>{b['start']:02d}:00</td><td>{b['hours']} h</td><td>"
        f'<form method="post" action="/booking/cancel"><input type="hidden" name="code" value="{esc(b["code"])}">'
        f'<button type="submit" aria-label="Cancel booking {esc(b["code"])}">Cancel</button></form></td></tr>'
        for b in state["booking"]["bookings"]
        if b.get("mine")
    )
    table = (
        "<table><thead><tr><th>Code</th><th>Room</th><th>Date</th><th>Start</th><th>Length</th><th>Action</th></tr>"
        f"</thead><tbody>{rows}</tbody></table>"
        if rows
        else "<p>You have no bookings.</p>"
    )
    return Response(200, page("My bookings", f"<h1>My bookings</h1>{table}", state))


def cancel(state: State, request: Request, _: re.Match[str]) -> Response:
    """Cancel one of the user's bookings."""
    booking = state["booking"]
    code = request.arg("code")
    booking["bookings"] = [b for b in booking["bookings"] if not (b["code"] == code and b.get("mine"))]
    return Response.redirect("/booking/mine")


def register(router: AppRouter) -> None:
    """Add the booking app's routes."""
    router.add("GET", r"/booking", form_page)
    router.add("GET", r"/booking/availability", availability_page)
    router.add("POST", r"/booking/book", book)
    router.add("GET", r"/booking/confirmation/(?P<code>BK-\d+)", confirmation_page)
    router.add("GET", r"/booking/mine", mine_page)
    router.add("POST", r"/booking/cancel", cancel)
