"""Turns INI text into nested dictionaries."""


class ParseError(ValueError):
    """Raised for malformed input; ``lineno`` is 1-based."""

    def __init__(self, lineno: int, message: str) -> None:
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def parse(text: str) -> dict[str, dict[str, str]]:
    """Parse INI text into ``{section: {key: value}}`` with lowercase section and key names."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1].strip().lower()
            current = sections.setdefault(name, {})
            continue
        if "=" not in line:
            raise ParseError(lineno, f"expected 'key = value', got {line!r}")
        if current is None:
            raise ParseError(lineno, "key outside of any section")
        key, value = line.split("=", 1)
        current[key.strip().lower()] = value.strip()
    return sections
