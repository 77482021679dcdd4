"""Splitting one CSV line into fields."""


def split_line(line: str, quote: str = '"') -> list[str]:
    """Split ``line`` on commas, honouring quoted fields and doubled quotes."""
    fields: list[str] = []
    buf: list[str] = []
    in_quotes = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == quote and i + 1 < len(line) and line[i + 1] == quote:
                buf.append(quote)
                i += 1
            elif ch == quote:
                in_quotes = False
            else:
                buf.append(ch)
        elif ch == quote:
            in_quotes = True
        elif ch == ",":
            fields.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    if in_quotes:
        raise ValueError(f"unterminated quoted field in {line!r}")
    fields.append("".join(buf))
    return fields
