"""The agent's text view of a page: an accessibility-tree-like outline with every interactive element numbered.

``SNAPSHOT_JS`` runs in the page: it walks the visible DOM, writes one line per heading, paragraph, list item and
table row (cells joined by ``|``), and describes each interactive element in place as ``[N] role "name"`` plus its
state (value, checked, options, disabled, link target). It tags element N with ``data-orchard-id="N"`` so a tool call
naming N finds it; the numbers are reassigned at every observation. Accessible names follow the usual order:
``aria-label``, the element's label, its text, ``placeholder``, ``title``. The whole page is described, not only
the viewport (``scroll`` changes the screenshot, not the text view).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SNAPSHOT_JS = r"""
() => {
  let n = 0;
  const lines = [], elements = [];
  const INTERACTIVE = new Set(["A", "BUTTON", "INPUT", "SELECT", "TEXTAREA"]);
  const LINE = new Set(["H1","H2","H3","H4","H5","H6","P","LI","DT","DD","LABEL","LEGEND","CAPTION","SUMMARY","TR"]);
  const clean = (s) => (s || "").replace(/\s+/g, " ").trim();
  const visible = (el) => {
    if (el.type === "hidden") return false;
    const style = getComputedStyle(el);
    return style.display !== "none" && style.visibility !== "hidden" && el.getClientRects().length > 0;
  };
  const roleOf = (el) => {
    const role = el.getAttribute("role");
    if (role) return role;
    if (el.tagName === "A") return "link";
    if (el.tagName === "BUTTON") return "button";
    if (el.tagName === "SELECT") return "combobox";
    if (el.tagName === "TEXTAREA") return "textbox";
    const type = (el.type || "text").toLowerCase();
    if (type === "checkbox" || type === "radio") return type;
    if (type === "submit" || type === "button") return "button";
    if (type === "number") return "spinbutton";
    if (type === "date") return "date";
    return "textbox";
  };
  const labelText = (el) => {
    const label = el.labels && el.labels[0];
    if (!label) return "";
    const copy = label.cloneNode(true);
    copy.querySelectorAll("input,select,textarea,button").forEach((c) => c.remove());
    return clean(copy.textContent);
  };
  const nameOf = (el) => clean(el.getAttribute("aria-label")) || labelText(el) ||
    (el.tagName === "INPUT" || el.tagName === "SELECT" ? "" : clean(el.innerText)) ||
    clean(el.getAttribute("placeholder")) || clean(el.getAttribute("title")) || clean(el.value);
  const describe = (el) => {
    const id = ++n, role = roleOf(el), name = nameOf(el);
    el.setAttribute("data-orchard-id", String(id));
    elements.push({id, role, name});
    let text = `[${id}] ${role} ${JSON.stringify(name)}`;
    if (role === "checkbox" || role === "radio") text += el.checked ? " (checked)" : " (not checked)";
    else if (el.tagName === "SELECT") {
      const chosen = el.selectedOptions[0];
      text += ` value=${JSON.stringify(chosen ? clean(chosen.textContent) : "")} options=` +
        JSON.stringify(Array.from(el.options).map((o) => clean(o.textContent)));
    } else if (el.tagName === "INPUT" || el.tagName === "TEXTAREA") text += ` value=${JSON.stringify(el.value)}`;
    else if (el.tagName === "A" && el.getAttribute("href")) text += ` -> ${el.getAttribute("href")}`;
    if (el.disabled) text += " (disabled)";
    return text;
  };
  const inline = (el) => {
    const parts = [];
    for (const child of el.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) { const t = clean(child.textContent); if (t) parts.push(t); continue; }
      if (child.nodeType !== Node.ELEMENT_NODE || !visible(child)) continue;
      if (INTERACTIVE.has(child.tagName)) parts.push(describe(child));
      else { const t = inline(child); if (t) parts.push(t); }
    }
    return parts.join(" ");
  };
  const block = (el, depth) => {
    for (const child of el.children) {
      if (!visible(child) || child.tagName === "SCRIPT" || child.tagName === "STYLE") continue;
      const pad = "  ".repeat(depth);
      if (/^H[1-6]$/.test(child.tagName)) lines.push(`${pad}heading ${JSON.stringify(clean(child.innerText))}`);
      else if (child.tagName === "TR") {
        const cells = Array.from(child.children).filter(visible).map(inline);
        lines.push(`${pad}row: ${cells.join(" | ")}`);
      } else if (child.tagName === "LABEL" && child.querySelector("input,select,textarea,button")) {
        const controls = Array.from(child.querySelectorAll("input,select,textarea,button")).filter(visible);
        lines.push(pad + controls.map(describe).join(" "));  // the label's text is the control's name
      } else if (LINE.has(child.tagName) || INTERACTIVE.has(child.tagName)) {
        const t = INTERACTIVE.has(child.tagName) ? describe(child) : inline(child);
        if (t) lines.push(pad + (child.getAttribute("role") === "alert" ? "alert: " : "") + t);
      } else if (child.getAttribute("role") === "alert") lines.push(`${pad}alert: ${inline(child)}`);
      else if (child.children.length) block(child, ["FORM", "NAV"].includes(child.tagName) ? depth + 1 : depth);
      else { const t = inline(child); if (t) lines.push(pad + t); }
    }
  };
  block(document.body, 0);
  return {title: document.title, url: location.href, lines, elements};
}
"""


@dataclass(frozen=True)
class ElementRef:
    """One numbered element of a view."""

    id: int
    role: str
    name: str


@dataclass(frozen=True)
class PageView:
    """What ``SNAPSHOT_JS`` returned: title, URL, outline lines and the numbered elements."""

    title: str
    url: str
    lines: list[str]
    elements: list[ElementRef]

    @classmethod
    def from_snapshot(cls, raw: dict[str, Any]) -> PageView:
        """Build from the script's result."""
        elements = [ElementRef(int(e["id"]), str(e["role"]), str(e["name"])) for e in raw.get("elements", [])]
        return cls(str(raw.get("title", "")), str(raw.get("url", "")), [str(x) for x in raw.get("lines", [])], elements)

    def render(self, max_chars: int = 12_000) -> str:
        """The text the model reads (the outline cut at ``max_chars``)."""
        text = f"Page: {self.title}\nURL: {self.url}\n" + "\n".join(self.lines)
        return text if len(text) <= max_chars else text[:max_chars] + "\n[... page truncated ...]"

    def resolve(self, element: object) -> int | None:
        """The number of ``element``: an int, a string of digits, or an element's exact name (case-insensitive)."""
        if isinstance(element, bool):
            return None
        if isinstance(element, int):
            return element if any(e.id == element for e in self.elements) else None
        text = str(element).strip().strip("[]")
        if text.isdigit():
            return self.resolve(int(text))
        wanted = text.strip('"').casefold()
        return next((e.id for e in self.elements if e.name.casefold() == wanted), None)
