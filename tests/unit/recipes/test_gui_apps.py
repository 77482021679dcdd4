"""The GUI apps' handlers (shop filters, cart and checkout; booking validation; docs search) and the HTTP server that
persists their state for the grader."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import httpx

from recipes.gui.apps.core import Request
from recipes.gui.apps.server import AppHost, serve
from recipes.gui.world import build_world

WORLD = build_world("apps-test")


def host() -> AppHost:
    return AppHost(json.loads(json.dumps(WORLD)), None)


def get(app: AppHost, path: str) -> str:
    response = app.handle(Request.parse("GET", path))
    assert response.status == 200, response.body[-300:]
    return response.body


def post(app: AppHost, path: str, **form: Any) -> Any:
    return app.handle(Request("POST", path, {}, {k: str(v) for k, v in form.items()}))


def test_shop_filters_sort_and_hide_what_does_not_match() -> None:
    app = host()
    products = [p for p in WORLD["shop"]["products"] if p["category"] == "mug" and p["in_stock"]]
    cheapest = min(products, key=lambda p: p["price"])
    page = get(app, "/shop?category=mug&in_stock=1&sort=price_asc")
    assert f"{len(products)} products" in page
    assert page.index(cheapest["name"]) < min(page.index(p["name"]) for p in products if p is not cheapest)
    assert "0 products" in get(app, "/shop?q=no-such-thing")


def test_cart_and_checkout_refuse_bad_input_and_record_the_order() -> None:
    app = host()
    out_of_stock = next(p for p in WORLD["shop"]["products"] if not p["in_stock"])
    assert post(app, "/shop/cart/add", sku=out_of_stock["sku"]).status == 400
    assert post(app, "/shop/checkout", name="Ada", address="Elm", shipping="express").status == 422  # empty cart
    product = next(p for p in WORLD["shop"]["products"] if p["in_stock"])
    assert post(app, "/shop/cart/add", sku=product["sku"], qty=2).location == "/shop/cart"
    refused = post(app, "/shop/checkout", name="", address="Elm", shipping="teleport")
    assert refused.status == 422 and "Enter your full name." in refused.body and "Choose a shipping" in refused.body
    assert post(app, "/shop/checkout", name="Ada", address="Elm", shipping="express").location == "/shop/order/1001"
    [order] = app.state["shop"]["orders"]
    assert (order["lines"], order["total"], app.state["shop"]["cart"]) == (
        [{"sku": product["sku"], "qty": 2, "unit_price": product["price"]}], 2 * product["price"] + 1500, [],
    )  # fmt: skip


def test_booking_validation_names_every_problem_and_refuses_a_conflict() -> None:
    app = host()
    taken = next(b for b in WORLD["booking"]["bookings"] if not b["mine"])
    sunday = (dt.date.fromisoformat(WORLD["booking"]["window"]["start"]) + dt.timedelta(days=6)).isoformat()
    closed = post(app, "/booking/book", resource="delta", date=sunday, start=10, hours=1, guests=3, name="A", accept=1)
    assert closed.status == 422 and "We are closed on Sundays." in closed.body
    bad = post(app, "/booking/book", resource="alder", date="1999-01-01", start=17, hours=3, guests=9, name="")
    for message in ("Choose a date from", "Bookings must end by 18:00", "seats at most 2", "Enter your name", "Accept"):
        assert message in bad.body
    form = {"resource": taken["resource"], "date": taken["date"], "start": taken["start"], "hours": 1, "guests": 1}
    conflict = post(app, "/booking/book", **form, name="Ada", accept=1)
    assert conflict.status == 422 and "already booked" in conflict.body
    assert len(app.state["booking"]["bookings"]) == len(WORLD["booking"]["bookings"])


def test_docs_search_finds_the_page_that_holds_a_setting() -> None:
    app = host()
    page = get(app, "/docs/search?q=retry_limit")
    assert "1 results" in page and "/docs/page/network" in page
    assert "Setting retry_limit" in get(app, "/docs/page/network")


def test_the_server_persists_every_change_to_the_state_file_and_resumes_from_it(tmp_path: Path) -> None:
    seed, state = tmp_path / "seed.json", tmp_path / "state.json"
    seed.write_text(json.dumps(WORLD))
    server = serve(AppHost.open(seed, state))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        mine = next(b for b in WORLD["booking"]["bookings"] if b["mine"])
        reply = httpx.post(f"{url}/booking/cancel", data={"code": mine["code"]}, follow_redirects=True)
        assert reply.status_code == 200 and mine["code"] not in reply.text
        assert httpx.get(f"{url}/nowhere").status_code == 404
    finally:
        server.shutdown()
        server.server_close()
    saved = json.loads(state.read_text())
    assert mine["code"] not in {b["code"] for b in saved["booking"]["bookings"]}
    assert AppHost.open(seed, state).state == saved  # a restarted server continues from the state file
