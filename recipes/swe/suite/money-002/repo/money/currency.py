"""Currency metadata."""

_MINOR_UNITS = {"USD": 2, "EUR": 2, "GBP": 2, "JPY": 0, "KWD": 3}


def minor_units(code: str) -> int:
    """Number of decimal places of currency ``code``."""
    try:
        return _MINOR_UNITS[code]
    except KeyError:
        raise ValueError(f"unknown currency: {code!r}") from None
