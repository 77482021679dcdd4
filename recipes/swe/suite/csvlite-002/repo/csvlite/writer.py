"""Writing CSV text."""

from collections.abc import Iterable


def format_field(value: object, delimiter: str = ",", quote: str = '"') -> str:
    """Quote ``value`` when it contains the delimiter, a quote or a newline."""
    text = str(value)
    if delimiter in text or quote in text or "\n" in text:
        return quote + text.replace(quote, quote * 2) + quote
    return text


def write_rows(rows: Iterable[Iterable[object]], delimiter: str = ",") -> str:
    """Rows as CSV text, one line per row."""
    return "".join(delimiter.join(format_field(v, delimiter) for v in row) + "\n" for row in rows)
