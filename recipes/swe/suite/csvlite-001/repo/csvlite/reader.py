"""Reading CSV text."""

from csvlite.lexer import split_line


def read_rows(text: str, delimiter: str = ",") -> list[list[str]]:
    """All non-blank lines of ``text`` split into fields."""
    return [split_line(line, delimiter) for line in text.splitlines() if line.strip()]


def read_records(text: str, delimiter: str = ",") -> list[dict[str, str]]:
    """Rows as dicts keyed by the header row."""
    rows = read_rows(text, delimiter)
    if not rows:
        return []
    header, *body = rows
    records = []
    for number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"row {number}: expected {len(header)} fields, got {len(row)}")
        records.append(dict(zip(header, row, strict=True)))
    return records
