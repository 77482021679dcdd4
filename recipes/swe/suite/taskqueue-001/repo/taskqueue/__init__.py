"""Priority scheduling."""

from taskqueue.scheduler import Scheduler

__all__ = ["Scheduler"]
