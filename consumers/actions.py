"""What an agent step did, read from its tool calls and the results the harness sent back: commands run, files
edited or read, tests run, exit codes. Credit assignment (``consumers.credit``) judges steps by these actions.

Where the facts come from:

- a tool call's command: the ``command`` (or ``cmd``) argument of any tool, a string or an argv list (Codex sends
  ``["bash", "-lc", "..."]``); harnesses without tools (mini-swe-agent) put commands in fenced ``bash``/``sh`` blocks
  of the response text, and each block is read as one command;
- files edited: shell redirections (``>``, ``>>``, ``tee``), ``sed -i``/``perl -i``, ``cp``/``mv`` targets,
  Python ``open(path, "w")`` in inline scripts, patch headers (``*** Update File: p``, ``+++ b/p``), and editor
  tools with a path argument (``path``, ``file_path``, ``filename``) and some content argument;
- the result: the ``tool`` message answering the call's id in any later request (the built-in agent writes
  ``{"exit_code": N, "output": "..."}`` and ``{"error": "..."}`` for a malformed call), or, for text harnesses,
  the first message after the step's reply in the next call of its conversation (``<returncode>N</returncode>``).

These are heuristics over shell text, kept deliberately simple: heredoc bodies and quoted strings are blanked
before redirections are parsed (so ``python - <<EOF ... a > b`` is not an edit of ``b``), and anything unrecognised
is simply no action, never an error. Everything here is a pure function of the trajectory, so the actions can be
computed once when a trajectory arrives and stored.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchard.trajectory import Step

TEST_RUNNER = re.compile(
    r"\b(pytest|py\.test|nosetests|tox|nox|jest|mocha|vitest|phpunit|rspec|ctest)\b"
    r"|\bpython[\d.]*\s+(-\w+\s+)*-m\s+(pytest|unittest)\b"
    r"|\b(go|cargo|dotnet|mvn|gradle|mix|swift)\s+test\b"
    r"|\b(npm|yarn|pnpm)\s+(run\s+)?test\b|\bmake\s+(test|check)\b|\bmanage\.py\s+test\b"
)
RUNS_CODE = re.compile(
    r"(^|[\s;&|(])(python[\d.]*|node|ruby|perl|bash|sh|php)\s+(-[a-zA-Z]+\s+)*[^\s;&|<>-][^\s;&|<>]*\.(py|js|mjs|rb|pl|sh|php)\b"
    r"|\bpython[\d.]*\s+(-\w+\s+)*-c\s|\bpython[\d.]*\s+-\s*(<<|$)|\b(go|cargo)\s+run\b|(^|[;&|(]\s*)\./[\w./-]+"
)
TEST_PATH = re.compile(r"(^|/)(tests?/|test_[^/]*$|[^/]*_tests?\.\w+$|[^/]*\.(test|spec)\.\w+$|conftest\.py$|repro)")
ERROR_OUTPUT = re.compile(r"Traceback \(most recent call last\)|\b\w*Error\b|\bFAILED\b|\bFAIL\b|\bassert", re.I)
NOT_FOUND = re.compile(r"command not found|No such file or directory|not recognized as", re.I)
MAX_COMMAND_CHARS = 300
SCRATCH_DIRS = ("/tmp/", "/var/tmp/", "/dev/")  # noqa: S108 - recognising paths in transcripts, not using them
READERS = frozenset({"cat", "head", "tail", "less", "more", "nl", "sed", "grep", "rg", "awk", "view", "bat", "wc"})
EDIT_TOOLS = re.compile(r"apply_patch|edit|write|create|replace|str_replace|patch|insert", re.I)
PATH_ARGUMENTS = ("path", "file_path", "filename", "file")
CONTENT_ARGUMENTS = ("content", "file_text", "new_str", "new_string", "text", "patch", "diff", "input", "insert_text")

_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_QUOTED = re.compile(r"(?<![>\w])(?<!> )(?<!tee )(\"[^\"]*\"|'[^']*')")
_REDIRECT = re.compile(r"(?<![0-9&<>])>{1,2}\s*([^\s;&|<>()]+)")
_TEE = re.compile(r"\btee\s+(?:-a\s+)?([^\s;&|<>()]+)")
_OPEN_WRITE = re.compile(r"open\(\s*['\"]([^'\"]+)['\"]\s*,\s*['\"][wax]")
_PATCH_HEADER = re.compile(r"^(?:\*\*\* (?:Update|Add) File:\s*(\S+)|\+\+\+ (?:b/)?(\S+))", re.M)
_SEGMENT = re.compile(r"&&|\|\||[;|\n]")
_FENCE = re.compile(
    r"```(?:bash|sh|shell|console|mswea_bash_command)?[ \t]*\n(.*?)```|<mswea_bash_command>(.*?)</", re.S
)
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>|\bexit(?:ed with)? code:?\s*(-?\d+)", re.I)


@dataclass(frozen=True, slots=True)
class Action:
    """One thing a step did: a tool call, or a fenced command in a text reply."""

    tool: str  # the tool's name; "text" for a command found in the response text
    command: str | None = None  # the shell command, whitespace-normalised (a digest past MAX_COMMAND_CHARS)
    edited: tuple[str, ...] = ()  # paths written
    read: tuple[str, ...] = ()  # paths read
    runs_tests: bool = False
    runs_code: bool = False  # runs tests or a program/script (what can reproduce or verify a bug)
    invalid: bool = False  # malformed arguments, unknown tool, or a command that was not found
    exit_code: int | None = None  # from the result; None when no result was found
    error_output: bool = False  # the result shows a traceback, an error or a failing test

    @property
    def key(self) -> str:
        """What makes two actions the same (for "repeated" detection)."""
        return self.command if self.command is not None else f"{self.tool}:{','.join(self.edited)}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``from_json`` reverses it)."""
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Action:
        """The action ``to_json`` wrote."""
        return cls(**{**data, "edited": tuple(data["edited"]), "read": tuple(data["read"])})


def trajectory_actions(steps: Sequence[Step]) -> list[tuple[Action, ...]]:
    """The actions of every step (in the given order), each with its result when a later request carries it."""
    results = _tool_results(steps)
    following = _next_in_conversation(steps)
    out = []
    for position, step in enumerate(steps):
        if step.response_tool_calls:
            out.append(tuple(_tool_call_action(call, results) for call in step.response_tool_calls))
        else:
            nxt = following.get(position)
            observation = _text_observation(step, steps[nxt]) if nxt is not None else None
            out.append(tuple(_text_actions(step.response_text, observation)))
    return out


def command_action(tool: str, command: str, result: str | None = None) -> Action:
    """The action of running shell ``command`` whose result text (if known) is ``result``."""
    exit_code, error_output, invalid = _parse_result(result)
    edited = edited_paths(command)
    return Action(
        tool=tool,
        command=_command_key(command),
        edited=tuple(edited),
        read=tuple(path for path in read_paths(command) if path not in edited),
        runs_tests=bool(TEST_RUNNER.search(command)),
        runs_code=bool(TEST_RUNNER.search(command) or RUNS_CODE.search(command)),
        invalid=invalid or exit_code == 127,
        exit_code=exit_code,
        error_output=error_output,
    )


def _command_key(command: str) -> str:
    """The command, whitespace-normalised; a long one (a heredoc writing a file) as a digest: it only serves to
    recognise a repeated command, and the facts of every call are kept in the sample builder's state."""
    normalised = " ".join(command.split())
    if len(normalised) <= MAX_COMMAND_CHARS:
        return normalised
    return f"{normalised[:80]}... sha256:{hashlib.sha256(normalised.encode()).hexdigest()}"


def edited_paths(command: str) -> list[str]:
    """Files a shell command writes (redirections, tee, in-place edits, copies, inline ``open(p, "w")``)."""
    paths = [*_OPEN_WRITE.findall(command), *(a or b for a, b in _PATCH_HEADER.findall(command))]
    plain = _QUOTED.sub('""', _strip_heredoc_bodies(command))
    paths += _REDIRECT.findall(plain) + _TEE.findall(plain)
    for words in _segments(plain):
        if words[0] in ("sed", "perl") and any(w.startswith("-i") or w == "-pi" for w in words[1:]):
            paths += [w for w in words[2:] if _looks_like_path(w)][-1:]
        elif words[0] in ("cp", "mv") and len(words) >= 3:
            paths.append(words[-1])
    return _unique(normalise_path(p) for p in paths if not p.startswith(("/dev/", "&")) and p != '""')


def read_paths(command: str) -> list[str]:
    """Files a shell command reads with a pager, grep, sed or the like."""
    paths = []
    for words in _segments(_QUOTED.sub('""', _strip_heredoc_bodies(command))):
        if words[0] in READERS:
            paths += [w for w in words[1:] if _looks_like_path(w)]
    return _unique(normalise_path(p) for p in paths)


def normalise_path(path: str) -> str:
    """``path`` without quotes, a leading ``./`` or doubled slashes."""
    path = path.strip("'\"")
    while path.startswith("./"):
        path = path[2:]
    return re.sub(r"/{2,}", "/", path)


def same_file(a: str, b: str) -> bool:
    """Whether two normalised paths name the same file (one may be absolute, the other relative to the repo)."""
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


def is_scratch_path(path: str) -> bool:
    """Whether a path is scratch space outside the project (``/tmp``): writing there edits nothing that matters."""
    return path.startswith(SCRATCH_DIRS)


def is_test_path(path: str) -> bool:
    """Whether a path looks like a test or a reproduction script."""
    return bool(TEST_PATH.search(path))


def _tool_call_action(call: Mapping[str, Any], results: Mapping[str, str]) -> Action:
    function = call.get("function") or call
    name = str(function.get("name") or "unknown")
    result = results.get(str(call.get("id", "")))
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        arguments = None
    if not isinstance(arguments, dict):
        return Action(tool=name, invalid=True)
    command = arguments.get("command", arguments.get("cmd"))
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        command = command[-1] if len(command) >= 3 and command[1] in ("-c", "-lc") else " ".join(command)
    if isinstance(command, str) and not _editor_call(name, arguments):
        return command_action(name, command, result)
    return _editor_action(name, arguments, result)


def _editor_call(name: str, arguments: Mapping[str, Any]) -> bool:
    return any(key in arguments for key in PATH_ARGUMENTS) and bool(EDIT_TOOLS.search(name))


def _editor_action(name: str, arguments: Mapping[str, Any], result: str | None) -> Action:
    path = next((arguments[key] for key in PATH_ARGUMENTS if isinstance(arguments.get(key), str)), None)
    patch = next((arguments[key] for key in ("patch", "input", "diff") if isinstance(arguments.get(key), str)), "")
    edited = [normalise_path(a or b) for a, b in _PATCH_HEADER.findall(patch)]
    writes = any(key in arguments for key in CONTENT_ARGUMENTS)
    if path is not None and writes:
        edited.insert(0, normalise_path(path))
    _, _, invalid = _parse_result(result)
    read = (normalise_path(path),) if path is not None and not writes else ()
    return Action(tool=name, edited=tuple(_unique(edited)), read=read, invalid=invalid)


def _text_actions(text: str, observation: str | None) -> list[Action]:
    blocks = [(fenced or tagged).strip() for fenced, tagged in _FENCE.findall(text) if (fenced or tagged).strip()]
    # the observation answers the last command when a reply holds several (harnesses run one per turn)
    last = len(blocks) - 1
    return [command_action("text", block, observation if i == last else None) for i, block in enumerate(blocks)]


def _parse_result(result: str | None) -> tuple[int | None, bool, bool]:
    """(exit code, whether the output shows an error, whether the call itself was invalid)."""
    if result is None:
        return None, False, False
    try:
        payload = json.loads(result)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        if "error" in payload and "exit_code" not in payload:
            return None, True, True
        code = payload.get("exit_code")
        output = str(payload.get("output", ""))
        exit_code = code if isinstance(code, int) else None
    else:
        match = _RETURNCODE.search(result)
        exit_code = int(match.group(1) or match.group(2)) if match else None
        output = result
    not_found = exit_code == 127 or (exit_code not in (None, 0) and bool(NOT_FOUND.search(output[:300])))
    return exit_code, bool(ERROR_OUTPUT.search(output)), not_found


def _tool_results(steps: Sequence[Step]) -> dict[str, str]:
    results: dict[str, str] = {}
    for step in steps:
        for message in step.request_messages:
            if isinstance(message, Mapping) and message.get("role") == "tool" and message.get("tool_call_id"):
                results.setdefault(str(message["tool_call_id"]), _content_text(message.get("content")))
    return results


def _next_in_conversation(steps: Sequence[Step]) -> dict[int, int]:
    following: dict[int, int] = {}
    last: dict[int, int] = {}
    for position, step in enumerate(steps):
        if step.conversation_id in last:
            following[last[step.conversation_id]] = position
        last[step.conversation_id] = position
    return following


def _text_observation(step: Step, nxt: Step) -> str | None:
    """The first message after ``step``'s reply in the next request of its conversation."""
    later = nxt.request_messages[len(step.request_messages) + 1 :]
    return _content_text(later[0].get("content")) if later and isinstance(later[0], Mapping) else None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def _strip_heredoc_bodies(command: str) -> str:
    lines, kept, delimiter = command.split("\n"), [], None
    for line in lines:
        if delimiter is not None:
            if line.strip() == delimiter:
                delimiter = None
            continue
        kept.append(line)
        match = _HEREDOC.search(line)
        delimiter = match.group(1) if match else None
    return "\n".join(kept)


def _segments(command: str) -> Iterable[list[str]]:
    for segment in _SEGMENT.split(command):
        words = [w for w in segment.split() if w not in ("sudo", "env", "time")]
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]  # leading VAR=value assignments
        if words:
            yield words


def _looks_like_path(word: str) -> bool:
    word = word.strip("'\"")
    return not word.startswith("-") and ("/" in word or bool(re.search(r"\.\w{1,5}$", word))) and "=" not in word


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(item for item in items if item))
