"""Greedy line filling."""


def wrap(text: str, width: int) -> list[str]:
    """Lines of at most ``width`` characters; words longer than ``width`` are split."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    lines: list[str] = []
    current = ""
    for word in text.split():
        while len(word) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:width])
            word = word[width:]
        if not current:
            current = word
        elif len(current) + 1 + len(word) < width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def fill(text: str, width: int) -> str:
    """The wrapped lines of ``text`` joined by newlines."""
    return "\n".join(wrap(text, width))
