"""The browser harness: a tool-calling agent driving headless Chromium against the GUI apps in its sandbox.

Run inside a sandbox (from the task's working copy) as::

    OPENAI_API_KEY=<proxy token> python -m recipes.gui.agent --base-url http://127.0.0.1:9000/v1 --model policy \
        --task-file task.md --mode text|vision [--apps-dir .gui] [--chromium /usr/bin/chromium]

It starts the apps server (``python -m recipes.gui.apps.server`` on the working copy's ``.gui/seed.json``, state
persisted to ``.gui/state.json``) and Chromium through Playwright with the system executable (no browser download),
then runs the built-in agent's loop (``orchard.harnesses.builtin_agent``: its HTTP client, trajectory, outcome and
``Agent``, with the browser's tools): a chat completion with five tools, then each tool call run in the browser:

- ``click(element)``, ``type(element, text, submit=false)`` (a select picks the option with that label, a checkbox
  takes ``true``/``false``), ``scroll(direction)``, ``navigate(url)`` (a path is relative to the apps), and
  ``answer(text)``, which writes ``answer.txt`` in the working directory and ends the episode (``submitted``).
  ``element`` is the number shown as ``[N]`` in the text view (or, for scripted experts, an element's exact name).

Observations: every tool result, and the first user message, holds the page's text view (``page_view``: an
accessibility-tree-like outline with numbered interactive elements). Mode ``text`` sends only that: it needs no
vision model, so it is the CPU mode. Mode ``vision`` also sends a screenshot of the viewport after each model turn's
actions, as a user message whose content has an OpenAI ``image_url`` part with a ``data:image/png;base64`` URL (the
recording proxy stores such images by digest: ``producers.proxy.images``). The history is only ever appended to, so
each prompt extends the previous one, as prefix-delta recording expects.

Chromium runs with ``--no-sandbox`` (the episode sandbox already isolates it, and its own sandbox needs privileges
a sandboxed process has not got) and ``--disable-dev-shm-usage``. Its V8 reserves about 1 TiB of virtual address
space, so the task's ``limits.address_space_mb`` must be above that (the GUI tasks set 4 TiB; their real memory,
``memory_mb``, is 4 GiB for the whole sandbox).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urljoin

from orchard.harnesses.builtin_agent import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    Agent,
    AgentConfig,
    ChatClient,
    Outcome,
    Trajectory,
)
from recipes.gui.page_view import SNAPSHOT_JS, PageView

Mode = Literal["text", "vision"]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ("--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run", "--mute-audio")
ANSWER_FILE = "answer.txt"
ACTION_TIMEOUT_MS = 5_000
SCROLL_PX = 600

SYSTEM_PROMPT = """You are a web agent operating a browser. Each observation is a text outline of the current page;
interactive elements are numbered like [7]. Act with the tools: click an element, type into a field (or choose a
select option by its label), scroll, navigate to a URL, and call `answer` exactly once when the task is done (with
the answer when the task asks a question, else a one-line summary). Do not ask the user questions."""


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


ELEMENT = {"type": "integer", "description": "The element's number, as shown in brackets in the page view."}
BROWSER_TOOLS: list[dict[str, Any]] = [
    _function("click", "Click an element (link, button, checkbox, radio).", {"element": ELEMENT}, ["element"]),
    _function(
        "type",
        "Type text into a field (replacing its value); for a select, the label of the option to choose.",
        {"element": ELEMENT, "text": {"type": "string"}, "submit": {"type": "boolean", "description": "Press Enter."}},
        ["element", "text"],
    ),
    _function("scroll", "Scroll the page.", {"direction": {"type": "string", "enum": ["up", "down"]}}, ["direction"]),
    _function("navigate", "Open a URL (a path is relative to the apps).", {"url": {"type": "string"}}, ["url"]),
    _function("answer", "Finish the task with the answer (or a summary).", {"text": {"type": "string"}}, ["text"]),
]


@dataclass
class BrowserSettings:
    """Where the apps and the browser are, and what the model sees."""

    mode: Mode = "text"
    apps_dir: Path = Path(".gui")
    chromium: str = CHROMIUM
    viewport: tuple[int, int] = (1024, 768)
    max_view_chars: int = 12_000
    answer_file: Path = Path(ANSWER_FILE)
    python: str = sys.executable
    extra_args: list[str] = field(default_factory=list)


class AppsProcess:
    """The apps server, a child process serving the working copy's seed and persisting its state."""

    def __init__(self, apps_dir: Path, python: str) -> None:
        seed, state = apps_dir / "seed.json", apps_dir / "state.json"
        argv = [python, "-P", "-m", "recipes.gui.apps.server", "--seed", str(seed), "--state", str(state)]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)  # noqa: S603
        line = self.process.stdout.readline() if self.process.stdout else b""
        if not line:
            raise RuntimeError(f"the apps server did not start (exit {self.process.wait()})")
        self.url: str = json.loads(line)["url"]
        self.start_path: str = json.loads(seed.read_text(encoding="utf-8")).get("start_path", "/")

    def stop(self) -> None:
        """Stop the server (its state is already on disk)."""
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Browser:
    """Headless Chromium through Playwright: actions and observations."""

    def __init__(self, settings: BrowserSettings, base_url: str) -> None:
        from playwright.sync_api import sync_playwright  # imported here: `--help` works without it

        self.settings, self.base_url = settings, base_url
        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch(
            executable_path=settings.chromium, headless=True, args=[*CHROMIUM_ARGS, *settings.extra_args]
        )
        width, height = settings.viewport
        self.page = self.browser.new_page(viewport={"width": width, "height": height})
        self.page.set_default_timeout(ACTION_TIMEOUT_MS)
        self.view: PageView | None = None

    def observe(self) -> tuple[PageView, bytes | None]:
        """The page's text view (renumbering its elements) and, in vision mode, a PNG of the viewport."""
        self.page.wait_for_load_state("load")
        self.view = PageView.from_snapshot(self.page.evaluate(SNAPSHOT_JS))
        shot = self.page.screenshot(type="png") if self.settings.mode == "vision" else None
        return self.view, shot

    def navigate(self, url: str) -> str:
        """Open ``url`` (relative to the apps)."""
        response = self.page.goto(urljoin(self.base_url + "/", url))
        return f"opened {self.page.url}" + (f" (HTTP {response.status})" if response else "")

    def click(self, element: object) -> str:
        """Click element N."""
        number = self._number(element)
        self.page.locator(f'[data-orchard-id="{number}"]').click()
        return f"clicked [{number}]"

    def type(self, element: object, text: str, submit: bool = False) -> str:
        """Fill a field, pick a select option, or (un)check a box."""
        number = self._number(element)
        target = self.page.locator(f'[data-orchard-id="{number}"]')
        kind = target.evaluate("el => el.tagName === 'SELECT' ? 'select' : (el.type || '').toLowerCase()")
        if kind == "select":
            try:
                target.select_option(label=text)
            except Exception:  # not a label: try it as the option's value
                target.select_option(value=text)
        elif kind in ("checkbox", "radio"):
            target.set_checked(text.strip().lower() in ("true", "yes", "on", "1", "checked"))
        else:
            target.fill(text)
        if submit:
            target.press("Enter")
        return f"typed into [{number}]" + (" and pressed Enter" if submit else "")

    def scroll(self, direction: str) -> str:
        """Scroll by about a screen."""
        self.page.mouse.wheel(0, SCROLL_PX if direction != "up" else -SCROLL_PX)
        return f"scrolled {direction}"

    def _number(self, element: object) -> int:
        number = self.view.resolve(element) if self.view else None
        if number is None:
            raise ValueError(f"no element {element!r} on this page; use a number from the current view")
        return number

    def close(self) -> None:
        """Close the browser and the driver."""
        try:
            self.browser.close()
        finally:
            self.playwright.stop()


def image_part(png: bytes) -> dict[str, Any]:
    """An OpenAI ``image_url`` content part carrying ``png`` as a data URL."""
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


class BrowserAgent(Agent):
    """The built-in agent's loop with browser actions as its tools: ask the model, run its actions, observe, repeat
    until ``answer`` or a limit. The task goes in with the first observation; in vision mode each step's actions are
    followed by a screenshot."""

    def __init__(
        self,
        config: AgentConfig,
        settings: BrowserSettings,
        client: ChatClient,
        trajectory: Trajectory,
        browser: Browser,
    ) -> None:
        super().__init__(config, client, trajectory, system_prompt=SYSTEM_PROMPT)
        self.settings, self.browser = settings, browser
        del self.messages[1:]  # the task goes in with the first page view (run)

    def run(self, start_path: str = "/") -> Outcome:
        """Open the start page, then run to the end; model and tool failures become the outcome."""
        self.browser.navigate(start_path)
        view, shot = self.browser.observe()
        self.trajectory.write("start", model=self.config.model, task=self.config.task, mode=self.settings.mode,
                              tools=[t["function"]["name"] for t in BROWSER_TOOLS])  # fmt: skip
        first = f"{self.config.task}\n\nThe browser shows:\n{view.render(self.settings.max_view_chars)}"
        self.messages.append(self._user(first, shot))
        return self.loop()

    def _user(self, text: str, shot: bytes | None) -> dict[str, Any]:
        if shot is None:
            return {"role": "user", "content": text}
        self.trajectory.write("screenshot", sha256=hashlib.sha256(shot).hexdigest(), bytes=len(shot))
        return {"role": "user", "content": [{"type": "text", "text": text}, image_part(shot)]}

    def progress(self, event: str, **fields: Any) -> None:
        """Nothing per step: ``main`` reports the browser's start and the end on stderr."""

    def after_tool_calls(self, step: int) -> None:
        """In vision mode, a screenshot of the page after the step's actions."""
        if self.settings.mode == "vision":
            _, shot = self.browser.observe()
            self.messages.append(self._user("Screenshot of the page after your actions.", shot))

    def call_tool(self, step: int, call: dict[str, Any]) -> str | None:
        """Run one tool call and append the result (with the new text view); the text when it was ``answer``."""
        function = call.get("function") or {}
        name = function.get("name")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
            if name == "answer":
                text = str(arguments.get("text", ""))
                self.settings.answer_file.write_text(text + "\n", encoding="utf-8")
                self._reply(step, call, name, "answer recorded")
                return text
            result = self._act(str(name), arguments)
        except Exception as exc:  # a failed action is the model's feedback, not a crash
            result = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        view, _ = self.browser.observe()
        self._reply(step, call, name, f"{result}\n\n{view.render(self.settings.max_view_chars)}")
        return None

    def _act(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "click":
            return self.browser.click(arguments["element"])
        if name == "type":
            return self.browser.type(arguments["element"], str(arguments["text"]), bool(arguments.get("submit")))
        if name == "scroll":
            return self.browser.scroll(str(arguments.get("direction", "down")))
        if name == "navigate":
            return self.browser.navigate(str(arguments["url"]))
        raise ValueError(f"unknown tool {name!r}")


def parse_args(argv: Sequence[str] | None = None) -> tuple[AgentConfig, BrowserSettings]:
    """The run's settings from the command line (the API key from the environment)."""
    parser = argparse.ArgumentParser(prog="python -m recipes.gui.agent", description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--task-file", required=True, type=Path)
    parser.add_argument("--mode", choices=["text", "vision"], default="text")
    parser.add_argument("--apps-dir", type=Path, default=Path(".gui"))
    parser.add_argument("--chromium", default=CHROMIUM, help="Chromium executable (the system's).")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--max-view-chars", type=int, default=12_000)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--trajectory", type=Path, default=Path("trajectory.jsonl"))
    parser.add_argument("--extra-body", default="{}", help="JSON object merged into every request body.")
    parser.add_argument("--seed", type=int, help="Sampling seed of the episode (call i asks with seed + i).")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY")
    args = parser.parse_args(argv)
    if args.max_steps < 1 or args.retries < 0:
        parser.error("--max-steps must be >= 1 and --retries >= 0")
    extra = json.loads(args.extra_body)
    config = AgentConfig(
        base_url=args.base_url, model=args.model, task=args.task_file.read_text(encoding="utf-8"),
        api_key=os.environ.get(args.api_key_env, ""), max_steps=args.max_steps, timeout_s=args.timeout,
        request_timeout_s=args.request_timeout, retries=args.retries, temperature=args.temperature,
        max_tokens=args.max_tokens, trajectory=args.trajectory, seed=args.seed,
        extra_body={"tools": BROWSER_TOOLS, **extra},  # ChatClient merges extra_body over its own shell tools
    )  # fmt: skip
    settings = BrowserSettings(
        mode=args.mode, apps_dir=args.apps_dir, chromium=args.chromium, max_view_chars=args.max_view_chars
    )
    return config, settings


def _progress(event: str, **fields: Any) -> None:
    sys.stderr.write(json.dumps({"event": event, "component": "gui_agent", **fields}) + "\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one episode; exit 1 only when the model API failed or the apps or browser could not start."""
    try:
        config, settings = parse_args(argv)
    except (OSError, ValueError) as exc:
        _progress("bad_arguments", error=str(exc))
        return EXIT_USAGE
    trajectory, client = Trajectory(config.trajectory), ChatClient(config)
    apps: AppsProcess | None = None
    browser: Browser | None = None
    try:
        started = time.perf_counter()
        apps = AppsProcess(settings.apps_dir, settings.python)
        apps_ready = time.perf_counter()
        browser = Browser(settings, apps.url)
        # Chromium's start-up is a fixed cost of every episode: recorded so benchmarks can report it per episode
        timing = {"apps_ms": round((apps_ready - started) * 1000, 1),
                  "launch_ms": round((time.perf_counter() - apps_ready) * 1000, 1)}  # fmt: skip
        trajectory.write("browser_started", **timing)
        _progress("browser_started", **timing)
        outcome = BrowserAgent(config, settings, client, trajectory, browser).run(apps.start_path)
    except Exception as exc:  # the environment failed to start: report it as the outcome
        outcome = Outcome("error", 0, error=f"{type(exc).__name__}: {exc}")
    finally:
        if browser is not None:
            browser.close()
        if apps is not None:
            apps.stop()
        client.close()
    trajectory.write("end", status=outcome.status, steps=outcome.steps, submission=outcome.submission,
                     error=outcome.error)  # fmt: skip
    trajectory.close()
    _progress("end", status=outcome.status, steps=outcome.steps, error=outcome.error)
    return EXIT_ERROR if outcome.status == "error" else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
