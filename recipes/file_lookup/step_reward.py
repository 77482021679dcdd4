"""Dense rewards of the file-lookup recipe: a reward plug-in that scores every model call by what it did.

The outcome reward only says whether ``answer.txt`` ended up right. This plug-in (stage ``dense`` of
``recipe.yaml``) adds a score per call, from the episode's own record and nothing hidden: the instruction in the
first request names the file and key, and the tool results in later requests show what each command printed.

==================  ======  ==========================================================================
rule                weight  when
==================  ======  ==========================================================================
``read_target``     +0.5    the call ``cat``\\ s the named file for the first time
``read_index``      +0.4    in a two-hop task, it ``cat``\\ s ``index.txt`` for the first time
``read_other``      -0.1    the call reads another workspace file (a detour)
``write_observed``  +0.5    it writes ``answer.txt`` with the key's value as the named file printed it
``write_wrong``     -0.25   it writes a value that file did not print for the key (another line, a guess)
``repeat``          -0.25   the same command as an earlier call
``submit_early``    -0.5    ``submit`` before anything was written to ``answer.txt``
``no_op``           -0.25   no tool call at all, or one the harness rejected
==================  ======  ==========================================================================

In a two-hop task (``Write the value of y in the file named in index.txt to answer.txt.``) the named file is the one
the episode's first ``cat index.txt`` printed (``file: owl.txt``), wherever that read falls: reading the file before
the index is a ``read_target`` too, so guessing a file first never pays more than reading the index first. A command
that touches ``index.txt`` otherwise before that read (it may rewrite it), or no read of it at all, leaves the file
unknown: every file read is then ``read_other`` and every write ``write_wrong``.

A call's score is the sum of its rules (``details["rules"]`` lists them). Run it as its own consumer group and give
its scores a weight in the RL sample builder::

    orchard consumer run recipes.file_lookup.step_reward:FileLookupSteps
    ORCHARD_CONSUMERS__SAMPLE_BUILDER__SCORERS='{"file_lookup_steps": 0.5}' orchard consumer run sample-builder
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from consumers.rewards import RewardPlugin, Score, StepResult
from orchard.trajectory import Step, Trajectory
from recipes.file_lookup.generate import ANSWER_FILE

INSTRUCTION = re.compile(r"Write the value of (?P<key>\S+) in (?P<file>\S+) to answer\.txt\.")
INDEXED_INSTRUCTION = re.compile(
    r"Write the value of (?P<key>\S+) in the file named in (?P<index>\S+) to answer\.txt\."
)
INDEX_LINE = re.compile(r"^\s*file\s*[:=]\s*(?P<file>\S+)\s*$", re.MULTILINE)
WRITE = re.compile(r"^\s*(?:echo|printf)\s+(?P<value>.*?)\s*>\s*" + re.escape(ANSWER_FILE) + r"\s*$")
KEY_VALUE = re.compile(r"^\s*(\w+)\s*[:=]\s*(\S+)\s*$")
RULE_WEIGHTS: Mapping[str, float] = {
    "read_target": 0.5,
    "read_index": 0.4,  # a step towards the target, a little less than reading it: the two-hop path's reads total 0.9
    "read_other": -0.1,
    "write_observed": 0.5,
    "write_wrong": -0.25,
    "repeat": -0.25,
    "submit_early": -0.5,
    "no_op": -0.25,
}


@dataclass
class _Episode:
    """What the calls so far did: the instruction (and a two-hop task's index and the file it named), each file's
    printed ``key -> value``, commands, writes."""

    key: str | None
    file: str | None
    index: str | None = None
    printed: dict[str, dict[str, str]] = field(default_factory=dict)
    commands: set[str] = field(default_factory=set)
    read_target: bool = False
    read_index: bool = False
    wrote: bool = False


class FileLookupSteps(RewardPlugin):
    """Rule-based dense reward of the file-lookup task; the module docstring has the rules."""

    name: ClassVar[str] = "file_lookup_steps"

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        """Rule weights (``RULE_WEIGHTS`` by default; a partial mapping overrides just those rules)."""
        unknown = set(weights or {}) - set(RULE_WEIGHTS)
        if unknown:
            raise ValueError(f"unknown file_lookup_steps rule(s): {sorted(unknown)}; known: {sorted(RULE_WEIGHTS)}")
        self.weights = {**RULE_WEIGHTS, **(weights or {})}

    def score_episode(self, trajectory: Trajectory) -> list[Score]:
        """Every call, in call order (a call's rules depend on what the calls before it printed, and in a two-hop
        task on the file the index printed)."""
        steps = sorted(trajectory.steps, key=lambda step: step.call_index)
        results = _tool_results(steps)
        key, file, index = _instruction(steps)
        if index is not None:
            file = _indexed_file(steps, results, index)
        episode = _Episode(key, file, index)
        scores = []
        for step in steps:
            rules = self._step_rules(step, episode, results)
            total = sum(self.weights[rule] for rule in rules)
            scores.append(Score(step.call_index, float(total), details={"rules": rules}))
        return scores

    def score_step(self, step: Step, trajectory: Trajectory) -> StepResult:
        """The step's score within its trajectory."""
        return next(score for score in self.score_episode(trajectory) if score.call_index == step.call_index)

    def _step_rules(self, step: Step, episode: _Episode, results: Mapping[str, str]) -> list[str]:
        calls = [call for call in step.response_tool_calls if isinstance(call, Mapping)]
        if not calls:
            return [] if step.finish_reason == "stop" and episode.wrote else ["no_op"]
        rules: list[str] = []
        for call in calls:
            function = call.get("function") or {}
            name, arguments = function.get("name"), _arguments(function.get("arguments"))
            if name == "submit":
                rules += [] if episode.wrote else ["submit_early"]
            elif name == "shell" and isinstance(arguments.get("command"), str):
                rules += self._command_rules(arguments["command"], episode, results.get(str(call.get("id", ""))))
            else:
                rules.append("no_op")
        return rules

    @staticmethod
    def _command_rules(command: str, episode: _Episode, result: str | None) -> list[str]:
        normalised = " ".join(command.split())
        if normalised in episode.commands:
            return ["repeat"]
        episode.commands.add(normalised)
        if written := WRITE.match(command):
            episode.wrote = True
            value = written.group("value").strip("'\"")
            observed = episode.printed.get(episode.file or "", {}).get(episode.key or "")
            return ["write_observed"] if observed is not None and value == observed else ["write_wrong"]
        read = _cat_target(command)
        if read is None:
            return []
        if result is not None:
            episode.printed[read] = _key_values(result)
        if read == episode.index:
            first, episode.read_index = not episode.read_index, True
            return ["read_index"] if first else []
        if read != episode.file:
            return ["read_other"]
        first, episode.read_target = not episode.read_target, True
        return ["read_target"] if first else []


def _instruction(steps: Sequence[Step]) -> tuple[str | None, str | None, str | None]:
    """(key, file, None) named by the first user message, (key, None, index) in a two-hop task, or all None."""
    for step in steps[:1]:
        for message in step.request_messages:
            if isinstance(message, Mapping) and message.get("role") == "user":
                text = _text(message.get("content"))
                if found := INSTRUCTION.search(text):
                    return found.group("key"), found.group("file"), None
                if found := INDEXED_INSTRUCTION.search(text):
                    return found.group("key"), None, found.group("index")
    return None, None, None


PLAIN_LISTINGS = frozenset({"ls", "ls -l", "ls -la", "ls -a", "ls ."})
"""Commands before the index read that change nothing (a ``cat FILE`` of any file is the other kind)."""


def _indexed_file(steps: Sequence[Step], results: Mapping[str, str], index: str) -> str | None:
    """The file the first ``cat`` of ``index`` printed; None when none did, or when any command but a plain
    ``cat FILE`` or ``ls`` came before it.

    An allowlist, not a search for the index's name: ``echo file: cow.txt > inde?.txt``, ``mv`` or ``sed -i *.txt``
    rewrite the index without naming it, and what it prints after that is the agent's own word."""
    for step in steps:
        for call_id, command in _shell_commands(step):
            target = _cat_target(command)
            if target == index:
                found = INDEX_LINE.search(results.get(call_id, ""))
                return found.group("file").removeprefix("./") if found else None
            if target is None and command.strip() not in PLAIN_LISTINGS:
                return None
    return None


def _shell_commands(step: Step) -> Iterator[tuple[str, str]]:
    """(tool call id, command) of each ``shell`` call of the step."""
    for call in step.response_tool_calls:
        if isinstance(call, Mapping):
            function = call.get("function") or {}
            command = _arguments(function.get("arguments")).get("command")
            if function.get("name") == "shell" and isinstance(command, str):
                yield str(call.get("id", "")), command


def _tool_results(steps: Sequence[Step]) -> dict[str, str]:
    """Tool call id -> the ``output`` of its result, from the tool messages of every request."""
    results: dict[str, str] = {}
    for step in steps:
        for message in step.request_messages:
            if isinstance(message, Mapping) and message.get("role") == "tool":
                content = _text(message.get("content"))
                try:
                    decoded = json.loads(content)
                except ValueError:
                    decoded = {"output": content}
                output = decoded.get("output", "") if isinstance(decoded, dict) else content
                results[str(message.get("tool_call_id", ""))] = str(output)
    return results


def _cat_target(command: str) -> str | None:
    """The single file a ``cat FILE`` command reads, else None."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    return words[1].removeprefix("./") if len(words) == 2 and words[0] == "cat" else None  # noqa: PLR2004


def _key_values(output: str) -> dict[str, str]:
    """``key: value`` (or ``key=value``) lines of a printed file."""
    return {found.group(1): found.group(2) for found in map(KEY_VALUE.match, output.splitlines()) if found}


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        decoded = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return ""
