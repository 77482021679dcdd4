"""Typed access to parsed INI data."""

from iniparse.parser import parse

_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}


class Config:
    """Read-only view of an INI document."""

    def __init__(self, sections: dict[str, dict[str, str]]) -> None:
        self._sections = sections

    @classmethod
    def from_text(cls, text: str) -> "Config":
        """Parse ``text`` into a Config."""
        return cls(parse(text))

    def sections(self) -> list[str]:
        """Section names in file order."""
        return list(self._sections)

    def get(self, section: str, key: str, default: str | None = None) -> str | None:
        """The raw value of ``key`` in ``section``, or ``default``."""
        return self._sections.get(section, {}).get(key.lower(), default)

    def getint(self, section: str, key: str, default: int = 0) -> int:
        """The value as an int, or ``default`` when missing."""
        value = self.get(section, key)
        return default if value is None else int(value)

    def getboolean(self, section: str, key: str, default: bool = False) -> bool:
        """The value as a bool (1/yes/true/on, 0/no/false/off), or ``default`` when missing."""
        value = self.get(section, key)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ValueError(f"[{section}] {key}: not a boolean: {value!r}")
