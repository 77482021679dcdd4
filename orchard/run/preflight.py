"""What ``orchard run`` checks before anything starts, so a typo costs seconds, not the stages before it.

- **Settings**: every policy trainer's ``config:`` file and ``set:`` overrides go through the trainer's own config
  model (``trainers.config.load_trainer_config``), and every component's ``ORCHARD_*`` environment through Orchard's
  (``orchard.run.settings.load_full_config``), exactly as the component would read them when it starts; each problem
  names the component and the field.
- **Ports**: a server component's port must be free when it starts. Something already answering there (a stranger's
  server, another run) would otherwise pass the health check and be taken for the component (``port_taken``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from orchard.exceptions import ConfigError
from orchard.run.config import RUN_DIR, ComponentSpec, PolicyTrainerComponent, RunConfig
from orchard.run.settings import load_full_config

USAGE_EXIT = 2
"""The exit status of a usage error (click/typer and argparse): a bad option, not a crash; restarting cannot help."""


def component_problems(config: RunConfig, run_dir: Path, config_file: Path) -> list[str]:
    """Every settings problem of the recipe's components, one line each, naming the component (empty: all valid).
    ``config_file`` is the run's ``orchard.yaml``, which every component reads."""
    root = str(run_dir.resolve())
    problems: list[str] = []
    for name, spec in config.components.items():
        problems += [f"component {name!r}: {problem}" for problem in _problems(spec, root, config_file)]
    return problems


def check_components(config: RunConfig, run_dir: Path, config_file: Path) -> None:
    """Raise ``ConfigError`` listing every problem ``component_problems`` finds."""
    problems = component_problems(config, run_dir, config_file)
    if problems:
        raise ConfigError("the recipe's components would not start:\n  " + "\n  ".join(problems))


def _problems(spec: ComponentSpec, root: str, config_file: Path) -> list[str]:
    from trainers.config import load_trainer_config  # an entry point's check of the layer above the core

    problems: list[str] = []
    environment = {key: value for key, value in spec.env.items() if key.startswith("ORCHARD_")}
    if environment:
        try:
            with _environment(environment):
                load_full_config(config_file)
        except (ConfigError, ValueError) as exc:
            problems.append(f"env: {_one_line(exc)}")
    if isinstance(spec, PolicyTrainerComponent):
        path = Path(str(spec.config).replace(RUN_DIR, root)) if spec.config is not None else None
        if path is not None and not path.is_file():
            problems.append(f"config: no such file {path}")
        else:
            try:
                load_trainer_config(path, [override.replace(RUN_DIR, root) for override in spec.set])
            except ConfigError as exc:
                problems.append(f"set: {_one_line(exc)}")
    return problems


def _one_line(exc: Exception) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, and every other ``ORCHARD_*`` variable as it was, for the block."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def port_taken(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Whether something accepts connections on ``host:port`` (a wildcard bind is probed on loopback)."""
    address = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104 - probe a wildcard on loopback
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False
