"""The browser agent's loop with a stand-in browser and model: what it sends in text and vision mode, how tool calls
become browser actions, how it ends; and how the text view resolves element references."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from orchard.harnesses.builtin_agent import AgentConfig, Trajectory
from recipes.gui.agent import BROWSER_TOOLS, BrowserAgent, BrowserSettings, parse_args
from recipes.gui.harness import BrowserAgentAdapter
from recipes.gui.page_view import ElementRef, PageView

PNG = b"\x89PNG\r\n\x1a\nscreen"
VIEW = PageView(
    "Shop",
    "http://127.0.0.1:1/shop",
    ['[1] button "Add Kettle to cart"'],
    [ElementRef(1, "button", "Add Kettle to cart")],
)


class FakeBrowser:
    """Records actions; the view never changes."""

    def __init__(self, vision: bool) -> None:
        self.vision, self.actions = vision, []
        self.view = VIEW

    def observe(self) -> tuple[PageView, bytes | None]:
        return VIEW, PNG if self.vision else None

    def navigate(self, url: str) -> str:
        self.actions.append(("navigate", url))
        return f"opened {url}"

    def click(self, element: object) -> str:
        number = VIEW.resolve(element)
        if number is None:
            raise ValueError(f"no element {element!r} on this page")
        self.actions.append(("click", number))
        return f"clicked [{number}]"


class FakeClient:
    """Answers with one tool call per turn; keeps each request's messages."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls, self.seen = calls, []

    def complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        self.seen.append(json.loads(json.dumps(messages)))
        name, arguments = self.calls[len(self.seen) - 1]
        call = {
            "id": f"c{len(self.seen)}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}


def run(tmp_path: Path, mode: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, FakeClient, FakeBrowser]:
    config = AgentConfig(base_url="http://x/v1", model="m", task="Buy a kettle.", api_key="k", max_steps=5)
    settings = BrowserSettings(mode=mode, answer_file=tmp_path / "answer.txt")  # type: ignore[arg-type]
    client, browser = FakeClient(calls), FakeBrowser(mode == "vision")
    trajectory = Trajectory(tmp_path / "trajectory.jsonl")
    outcome = BrowserAgent(config, settings, client, trajectory, browser).run("/shop")  # type: ignore[arg-type]
    trajectory.close()
    return outcome, client, browser


def test_text_mode_sends_only_the_page_view_and_answer_ends_the_episode(tmp_path: Path) -> None:
    outcome, client, browser = run(tmp_path, "text", [("click", {"element": 1}), ("answer", {"text": "done"})])
    assert (outcome.status, outcome.steps, outcome.submission) == ("submitted", 2, "done")
    assert (tmp_path / "answer.txt").read_text() == "done\n"
    assert browser.actions == [("navigate", "/shop"), ("click", 1)]
    first, second = client.seen
    assert first[1] == {"role": "user", "content": "Buy a kettle.\n\nThe browser shows:\n" + VIEW.render()}
    assert second[-1]["role"] == "tool" and second[-1]["content"].startswith("clicked [1]\n\nPage: Shop")
    assert "image_url" not in json.dumps(second)


def test_vision_mode_adds_a_png_image_part_per_turn_and_only_appends_to_the_history(tmp_path: Path) -> None:
    _, client, _ = run(tmp_path, "vision", [("click", {"element": "Add Kettle to cart"}), ("answer", {"text": "ok"})])
    first, second = client.seen
    assert second[: len(first)] == first  # the prompt only grows: prefix-delta recording applies
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    for message in (first[1], second[-1]):
        assert message["role"] == "user" and message["content"][1] == {"type": "image_url", "image_url": {"url": url}}
    trajectory = (tmp_path / "trajectory.jsonl").read_text()
    events = [json.loads(line)["event"] for line in trajectory.splitlines()]
    assert events.count("screenshot") == 2 and base64.b64encode(PNG).decode() not in trajectory  # digests only


def test_a_failed_action_is_fed_back_and_the_step_budget_ends_the_episode(tmp_path: Path) -> None:
    outcome, client, _ = run(
        tmp_path, "text", [("click", {"element": 7}), ("fly", {})] + [("click", {"element": 1})] * 3
    )
    assert outcome.status == "max_steps"
    assert client.seen[1][-1]["content"].startswith("error: ValueError: no element 7 on this page")
    assert client.seen[2][-1]["content"].startswith("error: ValueError: unknown tool 'fly'")


def test_elements_resolve_by_number_or_exact_name() -> None:
    assert [VIEW.resolve(x) for x in (1, "1", "[1]", "add kettle to cart", 2, "Add", True)] == [
        1,
        1,
        1,
        1,
        None,
        None,
        None,
    ]


def test_the_command_line_sends_the_browser_tools_and_the_adapter_runs_it(tmp_path: Path) -> None:
    task = tmp_path / "task.md"
    task.write_text("Do it.")
    config, settings = parse_args(
        ["--base-url", "http://p/v1", "--model", "m", "--task-file", str(task), "--mode", "vision"]
    )
    assert config.extra_body["tools"] == BROWSER_TOOLS and settings.mode == "vision"
    assert [t["function"]["name"] for t in BROWSER_TOOLS] == ["click", "type", "scroll", "navigate", "answer"]
    with pytest.raises(ValueError, match="mode must be"):
        BrowserAgentAdapter(mode="audio")
