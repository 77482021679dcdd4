"""The browser harness's actions in real headless Chromium: each family's reference solution, replayed as the
agent's tool calls against the apps, passes the grader (so the browser path and the HTTP path agree), and the text
view numbers the elements a model acts on."""

from __future__ import annotations

import copy
import importlib.util
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from recipes.gui.agent import Browser, BrowserSettings
from recipes.gui.apps.server import AppHost, serve
from recipes.gui.tasks import FAMILIES, GRADER_SOURCE, SuiteConfig, generate_tasks

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium")
TASKS = generate_tasks(SuiteConfig(train_per_family=1, eval_per_family=0))
HOST = AppHost({}, None)


@pytest.fixture(scope="module")
def browser() -> Iterator[tuple[Browser, AppHost]]:
    """One Chromium for the module, against one apps server whose state each test replaces."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright", reason="Playwright is not installed (pip install playwright)")
    server = serve(HOST)
    chrome = Browser(BrowserSettings(mode="text", chromium=CHROMIUM), f"http://127.0.0.1:{server.server_address[1]}")
    yield chrome, HOST
    chrome.close()
    server.shutdown()
    server.server_close()


def _grader() -> Any:
    spec = importlib.util.spec_from_file_location("gui_grade_browser", GRADER_SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GRADER = _grader()


def test_each_family_has_a_task_here() -> None:
    assert sorted(t.family for t in TASKS) == sorted(FAMILIES)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.family)
def test_the_reference_browser_actions_solve_the_task(browser: tuple[Browser, AppHost], task: Any) -> None:
    chrome, host = browser
    host.state = copy.deepcopy(task.world)
    chrome.navigate(task.world["start_path"])
    chrome.observe()
    answer = None
    for action in task.actions:
        tool, arguments = action["tool"], action["arguments"]
        if tool == "answer":
            answer = arguments["text"]
            break
        if tool == "navigate":
            chrome.navigate(arguments["url"])
        elif tool == "click":
            chrome.click(arguments["element"])
        else:
            chrome.type(arguments["element"], arguments["text"], bool(arguments.get("submit")))
        chrome.observe()
    signals = GRADER.grade(task.expected, task.world, host.state, answer)
    assert signals["success"] == 1.0, signals


def test_the_text_view_numbers_elements_and_actions_take_those_numbers(browser: tuple[Browser, AppHost]) -> None:
    chrome, host = browser
    task = next(t for t in TASKS if t.family == "shop_cheapest")
    host.state = copy.deepcopy(task.world)
    chrome.navigate("/shop")
    view, shot = chrome.observe()
    text = view.render()
    assert shot is None and text.startswith("Page: Shop\nURL: http://127.0.0.1:")
    search = view.resolve("Search")
    assert search is not None and f'[{search}] textbox "Search" value=""' in text
    sort = next(e.id for e in view.elements if e.name == "Sort by")
    assert f'[{sort}] combobox "Sort by" value="Relevance"' in text
    chrome.type(sort, "Price: high to low")
    chrome.type(search, "kettle", submit=True)
    view, _ = chrome.observe()
    assert "sort=price_desc" in view.url and "q=kettle" in view.url
    assert 'value="Price: high to low"' in view.render()
    with pytest.raises(ValueError, match="no element 999 on this page"):
        chrome.click(999)
