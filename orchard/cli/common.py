"""What every ``orchard`` subcommand shares: the loaded config, the open bus, and error reporting."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.console import Console

from orchard.bus import Bus, open_bus
from orchard.logging import configure_logging
from orchard.run.settings import FullConfig, load_full_config

console = Console()
err_console = Console(stderr=True)


@dataclass
class CliState:
    """Options given before the subcommand, and what they lazily produce."""

    config_path: Path | None = None
    _config: FullConfig | None = field(default=None, repr=False)

    def config(self) -> FullConfig:
        """The validated config (file, then environment); loaded once."""
        if self._config is None:
            self._config = load_full_config(self.config_path)
            configure_logging(self._config.log_format, self._config.log_level)
        return self._config

    def bus(self) -> Bus:
        """Open the configured bus."""
        return open_bus(self.config().bus)


def state(ctx: typer.Context) -> CliState:
    """The ``CliState`` of this invocation."""
    obj = ctx.find_root().obj
    if not isinstance(obj, CliState):
        obj = CliState()
        ctx.find_root().obj = obj
    return obj
