"""Encoding and decoding Roman numerals."""

_TABLE = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n: int) -> str:
    """Roman numeral for ``n`` (1..3999)."""
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} is out of range 1..3999")
    out = []
    for value, symbol in _TABLE:
        count, n = divmod(n, value)
        out.append(symbol * count)
    return "".join(out)


def from_roman(text: str) -> int:
    """Integer value of a canonical Roman numeral."""
    if not text or any(ch not in _VALUES for ch in text):
        raise ValueError(f"invalid roman numeral: {text!r}")
    total = 0
    for i, ch in enumerate(text):
        value = _VALUES[ch]
        if i + 1 < len(text) and _VALUES[text[i + 1]] > value:
            total -= value
        else:
            total += value
    if not 1 <= total <= 3999 or to_roman(total) != text:
        raise ValueError(f"invalid roman numeral: {text!r}")
    return total
