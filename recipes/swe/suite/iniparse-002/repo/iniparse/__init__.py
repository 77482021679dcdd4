"""Minimal INI parsing."""

from iniparse.config import Config
from iniparse.parser import ParseError, parse

__all__ = ["Config", "ParseError", "parse"]
