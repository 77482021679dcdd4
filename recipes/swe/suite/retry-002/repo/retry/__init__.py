"""Retrying with exponential backoff."""

from retry.policy import backoff_delays
from retry.runner import retry

__all__ = ["backoff_delays", "retry"]
