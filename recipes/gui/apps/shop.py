"""The shop: a product list with search, filters and sorting, product pages, a cart and a checkout.

State (``state["shop"]``): ``products`` (sku, name, category, brand, price in cents, rating, in_stock), ``cart``
(lines of sku and qty), ``orders`` (id, lines with unit prices, shipping, name, address, total) and ``next_order``.
"""

from __future__ import annotations

import re
from typing import Any

from recipes.gui.apps.core import AppRouter, Request, Response, State, errors_html, esc, money, options, page

SHIPPING = {"standard": ("Standard (5-7 days)", 500), "express": ("Express (1-2 days)", 1500)}
SORTS = [("relevance", "Relevance"), ("price_asc", "Price: low to high"), ("price_desc", "Price: high to low"),
         ("rating", "Rating: high to low")]  # fmt: skip
MAX_QTY = 20


def products_matching(shop: dict[str, Any], request: Request) -> list[dict[str, Any]]:
    """The products the list shows for the request's search, filters and sort."""
    words = request.arg("q").lower().split()
    category, sort = request.arg("category"), request.arg("sort", "relevance")
    max_price, min_rating = _number(request.arg("max_price")), _number(request.arg("min_rating"))
    found = [
        product
        for product in shop["products"]
        if all(word in f"{product['name']} {product['brand']} {product['category']}".lower() for word in words)
        and (not category or product["category"] == category)
        and (max_price is None or product["price"] <= round(max_price * 100))
        and (min_rating is None or product["rating"] >= min_rating)
        and (not request.arg("in_stock") or product["in_stock"])
    ]
    keys = {
        "price_asc": lambda p: (p["price"], p["name"]),
        "price_desc": lambda p: (-p["price"], p["name"]),
        "rating": lambda p: (-p["rating"], p["price"], p["name"]),
    }
    return sorted(found, key=keys[sort]) if sort in keys else found


def _number(text: str) -> float | None:
    try:
        return float(text.replace("$", "")) if text else None
    except ValueError:
        return None


def _product(shop: dict[str, Any], sku: str) -> dict[str, Any] | None:
    return next((p for p in shop["products"] if p["sku"] == sku), None)


def list_page(state: State, request: Request, _: re.Match[str]) -> Response:
    """The product list with the filter form."""
    shop = state["shop"]
    categories = sorted({p["category"] for p in shop["products"]})
    found = products_matching(shop, request)
    ratings = [("", "Any"), ("3", "3 stars & up"), ("4", "4 stars & up"), ("4.5", "4.5 stars & up")]
    checked = " checked" if request.arg("in_stock") else ""
    category_options = options([("", "All"), *((c, c) for c in categories)], request.arg("category"))
    form = (
        '<form method="get" action="/shop" role="search" aria-label="Product filters">'
        f'<label>Search <input name="q" value="{esc(request.arg("q"))}"></label> '
        f'<label>Category <select name="category">{category_options}</select></label> '
        f'<label>Max price ($) <input name="max_price" value="{esc(request.arg("max_price"))}"></label> '
        f'<label>Min rating <select name="min_rating">{options(ratings, request.arg("min_rating"))}</select></label> '
        f'<label><input type="checkbox" name="in_stock" value="1"{checked}> In stock only</label> '
        f'<label>Sort by <select name="sort">{options(SORTS, request.arg("sort", "relevance"))}</select></label> '
        '<button type="submit">Apply filters</button></form>'
    )
    rows = "".join(_row(p) for p in found)
    table = (
        f"<p>{len(found)} products</p><table><thead><tr><th>Product</th><th>Brand</th><th>Price</th><th>Rating</th>"
        f"<th>Stock</th><th>Action</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    return Response(200, page("Shop", f"<h1>Shop</h1>{form}{table}", state))


def _row(product: dict[str, Any]) -> str:
    name = esc(product["name"])
    stock = "In stock" if product["in_stock"] else "Out of stock"
    disabled = "" if product["in_stock"] else " disabled"
    button = (
        f'<form method="post" action="/shop/cart/add"><input type="hidden" name="sku" value="{esc(product["sku"])}">'
        f'<button type="submit" aria-label="Add {name} to cart"{disabled}>Add to cart</button></form>'
    )
    return (
        f'<tr><td><a href="/shop/product/{esc(product["sku"])}">{name}</a></td><td>{esc(product["brand"])}</td>'
        f"<td>{money(product['price'])}</td><td>{product['rating']:.1f}</td><td>{stock}</td><td>{button}</td></tr>"
    )


def product_page(state: State, request: Request, match: re.Match[str]) -> Response:
    """One product with a quantity field."""
    product = _product(state["shop"], match["sku"])
    if product is None:
        return Response(404, page("Not found", "<p>No such product.</p>", state))
    name = esc(product["name"])
    form = (
        f'<form method="post" action="/shop/cart/add"><input type="hidden" name="sku" value="{esc(product["sku"])}">'
        f'<label>Quantity <input name="qty" type="number" min="1" max="{MAX_QTY}" value="1"></label> '
        f'<button type="submit"{"" if product["in_stock"] else " disabled"}>Add to cart</button></form>'
    )
    body = (
        f"<h1>{name}</h1><p>{esc(product['description'])}</p><dl><dt>Brand</dt><dd>{esc(product['brand'])}</dd>"
        f"<dt>Category</dt><dd>{esc(product['category'])}</dd><dt>Price</dt><dd>{money(product['price'])}</dd>"
        f"<dt>Rating</dt><dd>{product['rating']:.1f} of 5</dd><dt>Stock</dt>"
        f"<dd>{'In stock' if product['in_stock'] else 'Out of stock'}</dd></dl>{form}"
    )
    return Response(200, page(product["name"], body, state))


def add_to_cart(state: State, request: Request, _: re.Match[str]) -> Response:
    """Add ``qty`` (default 1) of ``sku``; out-of-stock products are refused."""
    shop = state["shop"]
    product = _product(shop, request.arg("sku"))
    qty = int(_number(request.arg("qty", "1")) or 0)
    if product is None or not product["in_stock"] or not 1 <= qty <= MAX_QTY:
        return Response(400, page("Cannot add", errors_html(["This product cannot be added."]), state))
    line = next((line for line in shop["cart"] if line["sku"] == product["sku"]), None)
    if line is None:
        shop["cart"].append({"sku": product["sku"], "qty": qty})
    else:
        line["qty"] = min(MAX_QTY, line["qty"] + qty)
    return Response.redirect("/shop/cart")


def remove_from_cart(state: State, request: Request, _: re.Match[str]) -> Response:
    """Remove a cart line."""
    shop = state["shop"]
    shop["cart"] = [line for line in shop["cart"] if line["sku"] != request.arg("sku")]
    return Response.redirect("/shop/cart")


def cart_lines(shop: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """(product, qty) of each cart line."""
    return [(p, line["qty"]) for line in shop["cart"] if (p := _product(shop, line["sku"])) is not None]


def cart_page(state: State, request: Request, _: re.Match[str]) -> Response:
    """The cart: lines, remove buttons, total, a link to checkout."""
    lines = cart_lines(state["shop"])
    if not lines:
        return Response(200, page("Cart", '<h1>Cart</h1><p>Your cart is empty.</p><a href="/shop">Shop</a>', state))
    rows = "".join(
        f"<tr><td>{esc(p['name'])}</td><td>{money(p['price'])}</td><td>{qty}</td><td>{money(p['price'] * qty)}</td>"
        f'<td><form method="post" action="/shop/cart/remove"><input type="hidden" name="sku" value="{esc(p["sku"])}">'
        f'<button type="submit" aria-label="Remove {esc(p["name"])}">Remove</button></form></td></tr>'
        for p, qty in lines
    )
    total = sum(p["price"] * qty for p, qty in lines)
    body = (
        "<h1>Cart</h1><table><thead><tr><th>Product</th><th>Price</th><th>Qty</th><th>Subtotal</th><th>Action</th>"
        f'</tr></thead><tbody>{rows}</tbody></table><p>Total: {money(total)}</p><a href="/shop/checkout">Checkout</a>'
    )
    return Response(200, page("Cart", body, state))


def checkout_page(state: State, request: Request, _: re.Match[str], errors: list[str] | None = None) -> Response:
    """The checkout form."""
    chosen = request.arg("shipping", "standard")
    radios = "".join(
        f'<label><input type="radio" name="shipping" value="{key}"{" checked" if key == chosen else ""}> '
        f"{esc(label)} {money(cost)}</label> "
        for key, (label, cost) in SHIPPING.items()
    )
    body = (
        f"<h1>Checkout</h1>{errors_html(errors or [])}"
        f'<form method="post" action="/shop/checkout"><label>Full name <input name="name" '
        f'value="{esc(request.arg("name"))}"></label> <label>Address <input name="address" '
        f'value="{esc(request.arg("address"))}"></label> <fieldset><legend>Shipping</legend>{radios}</fieldset>'
        '<button type="submit">Place order</button></form>'
    )
    return Response(422 if errors else 200, page("Checkout", body, state))


def place_order(state: State, request: Request, match: re.Match[str]) -> Response:
    """Turn the cart into an order (name, address and a known shipping method required)."""
    shop = state["shop"]
    lines = cart_lines(shop)
    shipping = request.arg("shipping")
    errors = [message for bad, message in (
        (not lines, "Your cart is empty."),
        (not request.arg("name"), "Enter your full name."),
        (not request.arg("address"), "Enter an address."),
        (shipping not in SHIPPING, "Choose a shipping method."),
    ) if bad]  # fmt: skip
    if errors:
        return checkout_page(state, request, match, errors)
    order = {
        "id": shop["next_order"],
        "lines": [{"sku": p["sku"], "qty": qty, "unit_price": p["price"]} for p, qty in lines],
        "shipping": shipping,
        "name": request.arg("name"),
        "address": request.arg("address"),
        "total": sum(p["price"] * qty for p, qty in lines) + SHIPPING[shipping][1],
    }
    shop["orders"].append(order)
    shop["next_order"] += 1
    shop["cart"] = []
    return Response.redirect(f"/shop/order/{order['id']}")


def order_page(state: State, request: Request, match: re.Match[str]) -> Response:
    """An order's confirmation."""
    order = next((o for o in state["shop"]["orders"] if str(o["id"]) == match["id"]), None)
    if order is None:
        return Response(404, page("Not found", "<p>No such order.</p>", state))
    items = "".join(f"<li>{line['qty']} x {esc(line['sku'])}</li>" for line in order["lines"])
    body = (
        f"<h1>Order {order['id']} confirmed</h1><p>Thank you, {esc(order['name'])}.</p><ul>{items}</ul>"
        f"<p>Shipping: {esc(order['shipping'])}. Total: {money(order['total'])}</p>"
    )
    return Response(200, page("Order confirmed", body, state))


def register(router: AppRouter) -> None:
    """Add the shop's routes."""
    router.add("GET", r"/shop", list_page)
    router.add("GET", r"/shop/product/(?P<sku>[\w-]+)", product_page)
    router.add("POST", r"/shop/cart/add", add_to_cart)
    router.add("POST", r"/shop/cart/remove", remove_from_cart)
    router.add("GET", r"/shop/cart", cart_page)
    router.add("GET", r"/shop/checkout", checkout_page)
    router.add("POST", r"/shop/checkout", place_order)
    router.add("GET", r"/shop/order/(?P<id>\d+)", order_page)
