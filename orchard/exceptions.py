"""Errors shared by the whole of Orchard; each subpackage derives its own from ``OrchardError``."""


class OrchardError(Exception):
    """Base class of every error Orchard raises on purpose."""


class ConfigError(OrchardError):
    """A configuration file or environment variable is invalid; the message names the field."""
