"""``orchard run``: a recipe's components as supervised processes sharing one run directory, bus and store."""

from orchard.run.config import RunConfig, load_run_config
from orchard.run.supervisor import Supervisor

__all__ = ["RunConfig", "Supervisor", "load_run_config"]
