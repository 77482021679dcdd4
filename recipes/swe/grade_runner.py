"""The Orchard-SWE grader's pytest run: ``python3 -I -B grade_runner.py PYTEST_ARGS...`` in the working copy.

``grade.py`` ships this file beside itself and starts it in a process group of its own. Standard library and pytest
only, Python 3.8 or newer (the interpreter of the task's image). The code under test runs in this process (the hidden
tests import it), so the run is built to make a forged result hard, and a detected attempt count:

- **No report file.** One line of JSON comes on stdin and is read before pytest starts: ``token`` (random per run),
  ``fd`` (the write end of a pipe this process inherited) and ``trusted`` (the working copy's files holding base or
  hidden-test content). Each report goes down the pipe as it arrives (``pytest_runtest_logreport``), one line each,
  prefixed with the token; ``grade.py`` ignores a line without it. The last line, ``finish``, carries the session's
  exit code and what was found tampered with.
- **Tamper check.** Before pytest parses its options (before any conftest or code of the working copy runs), the
  identities of what an outcome depends on are recorded: every function and class of pytest's runner, reports,
  python, main, skipping, outcomes, nodes and unittest modules and of pluggy (with each class's methods and
  properties, and each function's code object), ``os.write``, ``json``'s encoder, and this module's own functions
  and recorder; once the plugin manager exists, its hook callers and their executors. They are compared again when
  the session finishes and after ``pytest.main`` returns. A hook implementation of an outcome-deciding hook
  (``OUTCOME_HOOKS``) must come from a trusted file or from outside the working copy (pytest, its plugins).
- **Imports**: pytest comes from the interpreter's own path (a ``pytest.py`` or ``_pytest/`` in the working copy
  cannot stand in), the working copy goes last on ``sys.path``, and a standard-library name is always found outside
  it.

An expected failure counts as passing only when the test carries an ``xfail`` marker: code under test that calls
``pytest.xfail()`` does not pass a test.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import pkgutil
import sys
import sysconfig
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

ROOT = os.path.realpath(os.getcwd())
WATCHED_MODULES = (
    "_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.main", "_pytest.skipping", "_pytest.outcomes",
    "_pytest.nodes", "_pytest.unittest", "pluggy._hooks", "pluggy._callers", "pluggy._manager", "pluggy._result",
    "pluggy.hooks", "pluggy.callers", "pluggy.manager", "json", "json.encoder",
)  # fmt: skip
"""Modules whose functions and classes decide or carry an outcome (pluggy's names before and after 1.0)."""
WATCHED_CLASSES = ("TestReport", "BaseReport", "CollectReport", "CallInfo", "Function", "HookCaller", "HookImpl")
"""Classes of those modules that may not gain an attribute either (a ``passed`` property on ``TestReport``)."""
PYTEST_MARKS = frozenset({"_pytest_diamond_inheritance_warning_shown"})
"""Attributes pytest itself puts on its classes during a session."""
OUTCOME_HOOKS = (
    "pytest_runtestloop", "pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call",
    "pytest_runtest_teardown", "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_pyfunc_call",
    "pytest_collection", "pytest_collection_modifyitems", "pytest_make_collect_report", "pytest_collectreport",
    "pytest_pycollect_makeitem", "pytest_itemcollected",
)  # fmt: skip
"""Hooks whose implementations decide which tests run and what they report."""
if TYPE_CHECKING:  # annotations only: the runner may run under Python 3.8
    Snapshot = dict[str, tuple[Any, ...]]


def inside(entry: str) -> bool:
    """Whether a path is the working copy or under it."""
    path = os.path.realpath(entry or os.curdir)
    return path == ROOT or path.startswith(ROOT + os.sep)


sys.path[:] = [p for p in sys.path if not inside(p)]
import pytest  # noqa: E402 - from the interpreter's own path, never the working copy

for _name in WATCHED_MODULES:
    try:
        importlib.import_module(_name)
    except ImportError:
        pass
sys.path.append(ROOT)
ALLOWED_PREFIXES = tuple(os.path.realpath(p) + os.sep for p in sys.path if p and not inside(p))
ALLOWED_PREFIXES += (os.path.dirname(os.path.realpath(__file__)) + os.sep,)
"""Where code outside the working copy may come from: the interpreter's path (pytest, plugins) and this directory."""

_paths = sysconfig.get_paths()
STDLIB = getattr(sys, "stdlib_module_names", None) or {  # before 3.10: what the stdlib directories hold
    m.name for m in pkgutil.iter_modules([_paths["stdlib"], os.path.join(_paths["platstdlib"], "lib-dynload")])
}


class StandardLibraryFirst:
    """A meta path finder: a standard-library name is found outside the working copy, wherever pytest or a test
    puts it on ``sys.path``."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
        """The standard library's spec for a top-level standard-library ``name``, else ``None``."""
        if path is not None or name not in STDLIB:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if not inside(p)])
        return spec if spec is not None and spec.loader is not None else None


sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder), StandardLibraryFirst)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------- identities
def fingerprint(value: Any, cells: bool = False) -> tuple[Any, ...]:
    """The objects ``value``'s behaviour hangs on: itself, a property's accessors, a method's function, a
    function's code and defaults (and, with ``cells``, its closure's contents)."""
    parts: list[Any] = [value]
    if isinstance(value, property):
        for accessor in (value.fget, value.fset, value.fdel):
            parts += fingerprint(accessor) if accessor is not None else [None]
        return tuple(parts)
    function = getattr(value, "__func__", value)
    if isinstance(function, types.FunctionType):
        parts += [function, function.__code__, function.__defaults__, function.__kwdefaults__]
        if cells:
            parts += [cell.cell_contents for cell in function.__closure__ or ()]
    return tuple(parts)


def module_snapshot(module: types.ModuleType, cells: bool = False) -> Snapshot:
    """Fingerprints of ``module``'s functions and classes, and of every attribute of the classes it defines."""
    found: Snapshot = {}
    for name, value in list(vars(module).items()):
        if isinstance(value, type) and value.__module__ == module.__name__:
            for attr, member in list(vars(value).items()):
                found[f"{module.__name__}.{name}.{attr}"] = fingerprint(member, cells)
        if callable(value):
            found[f"{module.__name__}.{name}"] = fingerprint(value, cells)
    return found


def class_names() -> dict[str, frozenset]:
    """The attribute names of every watched class."""
    found = {}
    for module in filter(None, map(sys.modules.get, WATCHED_MODULES)):
        for name in WATCHED_CLASSES:
            cls = vars(module).get(name)
            if isinstance(cls, type) and cls.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = frozenset(vars(cls)) - PYTEST_MARKS
    return found


def bound(method: Any) -> tuple[Any, Any]:
    """A bound method as ``(function, instance)`` (each access makes a new bound method object)."""
    return getattr(method, "__func__", method), getattr(method, "__self__", None)


def manager_snapshot(manager: Any) -> Snapshot:
    """The plugin manager's hook relay and executors, and every hook caller it holds."""
    found: Snapshot = {
        "pluginmanager": (manager, type(manager), manager.hook, getattr(manager, "_inner_hookexec", None))
        + bound(getattr(manager, "_hookexec", None))
    }
    for name, caller in list(vars(manager.hook).items()):
        found[f"hook.{name}"] = (caller, type(caller)) + bound(getattr(caller, "_hookexec", None))
    return found


def global_snapshot() -> Snapshot:
    """Fingerprints of the watched modules, ``os.write``, ``json``'s default encoder and this module."""
    found: Snapshot = {"os.write": fingerprint(os.write), "json._default_encoder": (vars(json)["_default_encoder"],)}
    for module in filter(None, map(sys.modules.get, WATCHED_MODULES)):
        found.update(module_snapshot(module))
    found.update(module_snapshot(sys.modules[__name__], cells=True))
    return found


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """Names whose fingerprint changed or vanished."""
    changed = []
    for name, parts in before.items():
        now = after.get(name)
        if now is None or len(now) != len(parts) or any(a is not b for a, b in zip(parts, now)):  # noqa: B905 - 3.8
            changed.append(name)
    return changed


def code_file(function: Any) -> str:
    """The source file of a hook implementation's code (empty when it is not Python code)."""
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    return code.co_filename if isinstance(code, types.CodeType) else ""


def untrusted_hooks(manager: Any, trusted: frozenset) -> list[str]:
    """Outcome-deciding hook implementations from code of the working copy that is not at its base content, from a
    file that is not where pytest and its plugins are installed, or that are not Python functions."""
    found = []
    for name in OUTCOME_HOOKS:
        caller = getattr(manager.hook, name, None)
        for impl in caller.get_hookimpls() if caller is not None else ():
            path = code_file(impl.function)
            real = os.path.realpath(path) if os.path.isabs(path) else ""
            if not (real in trusted or (real and not inside(real) and real.startswith(ALLOWED_PREFIXES))):
                found.append(f"{name} implemented in {path or repr(impl.function)}")
    return found


# ---------------------------------------------------------------------------------------------------- recording
def make_emit(token: str, fd: int) -> Callable[[dict[str, Any]], None]:
    """A function writing one record as a line down ``fd``, prefixed with ``token``."""
    write, dumps, prefix = os.write, json.dumps, token + " "

    def emit(record: dict[str, Any]) -> None:
        data = (prefix + dumps(record) + "\n").encode("utf-8", "replace")
        while data:
            data = data[write(fd, data) :]

    return emit


class Recorder:
    """The pytest plugin that reports every test phase down the pipe and checks the session for tampering."""

    def __init__(self, emit: Callable[[dict[str, Any]], None], trusted: frozenset, before: Snapshot) -> None:
        self.emit, self.trusted, self.before = emit, trusted, before
        self.names = class_names()
        self.manager: Any = None
        self.xfail_marked: set = set()
        self.problems: list[str] = []
        before.update(self.own_snapshot())

    def own_snapshot(self) -> Snapshot:
        """This recorder's class, emitter (with its closure: the token and the descriptor) and trusted files."""
        return {"recorder": (type(self), self.trusted, self.before), "emit": fingerprint(self.emit, cells=True)}

    @pytest.hookimpl(tryfirst=True)
    def pytest_plugin_registered(self, plugin: Any, manager: Any) -> None:
        """On its own registration (before any conftest): note the plugin manager's hook callers."""
        if self.manager is None:
            self.manager = manager
            self.before.update(manager_snapshot(manager))

    def pytest_sessionstart(self, session: Any) -> None:
        """The ini option ``pythonpath`` (and conftests) put entries first: the working copy's go last again."""
        sys.path[:] = [p for p in sys.path if not inside(p)] + [p for p in sys.path if inside(p)]

    def pytest_collection_finish(self, session: Any) -> None:
        """Note the tests marked ``xfail`` (only their expected failures count as passing)."""
        self.xfail_marked = {item.nodeid for item in session.items if item.get_closest_marker("xfail") is not None}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: Any) -> None:
        """One line per test phase, as it is reported."""
        self.emit(
            {
                "event": "report",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "xfail": hasattr(report, "wasxfail"),
                "marked": report.nodeid in self.xfail_marked,
            }
        )

    def pytest_collectreport(self, report: Any) -> None:
        """A collection error, for the grader's log."""
        if report.failed:
            self.emit({"event": "collect", "nodeid": report.nodeid, "outcome": "failed"})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any) -> None:
        """Check for tampering before pytest's own clean-up runs."""
        self.problems += self.check()

    def check(self) -> list[str]:
        """What changed since the start: fingerprints, watched classes' attributes, outcome hooks, this recorder."""
        found = differences(self.before, {**global_snapshot(), **self.current_manager(), **self.own_snapshot()})
        found += [f"{name} gained {sorted(names - self.names[name])}" for name, names in class_names().items()
                  if name in self.names and names - self.names[name]]  # fmt: skip
        if self.manager is None or not self.manager.is_registered(self):
            found.append("the recorder is not registered")
        else:
            found += untrusted_hooks(self.manager, self.trusted)
        return found

    def current_manager(self) -> Snapshot:
        """The plugin manager's fingerprints now (none before it was seen)."""
        return manager_snapshot(self.manager) if self.manager is not None else {}


def read_setup() -> tuple[Callable[[dict[str, Any]], None], frozenset]:
    """Read the grader's line from stdin (then stdin is ``/dev/null``): the emitter and the trusted files."""
    setup = json.loads(sys.stdin.readline())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    trusted = frozenset(os.path.realpath(os.path.join(ROOT, path)) for path in setup["trusted"])
    return make_emit(str(setup["token"]), int(setup["fd"])), trusted


def main(args: list[str]) -> None:
    """Run pytest over ``args``; the last line down the pipe says how it ended and what was tampered with."""
    emit, trusted = read_setup()
    recorder = Recorder(emit, trusted, global_snapshot())
    try:
        code = int(pytest.main(args, plugins=[recorder]))
    except BaseException:  # noqa: BLE001 - code under test may raise anything out of the session: still checked
        code = -1
    problems = sorted(set(recorder.problems + recorder.check()))
    emit({"event": "finish", "exit": code, "tampered": problems})


if __name__ == "__main__":
    main(sys.argv[1:])
