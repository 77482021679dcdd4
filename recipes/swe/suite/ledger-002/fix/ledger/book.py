"""Accounts and transfers."""

from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")


class InsufficientFunds(Exception):
    """A debit would make a balance negative."""


def to_amount(value: str | int | float | Decimal) -> Decimal:
    """Convert ``value`` to a positive Decimal amount rounded to cents (floats by their printed value)."""
    if isinstance(value, float):
        value = str(value)
    amount = Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)
    if amount <= 0:
        raise ValueError(f"amount must be positive, got {value!r}")
    return amount


class Ledger:
    """Named accounts with Decimal balances."""

    def __init__(self) -> None:
        self._balances: dict[str, Decimal] = {}

    def open(self, name: str) -> None:
        """Create an empty account."""
        if name in self._balances:
            raise ValueError(f"account {name!r} already exists")
        self._balances[name] = Decimal("0.00")

    def balance(self, name: str) -> Decimal:
        """Current balance of ``name``."""
        return self._balances[name]

    def deposit(self, name: str, value: str | int | float | Decimal) -> None:
        """Credit ``name``."""
        self._balances[name] += to_amount(value)

    def withdraw(self, name: str, value: str | int | float | Decimal) -> None:
        """Debit ``name``; raises InsufficientFunds rather than overdrawing."""
        amount = to_amount(value)
        if self._balances[name] < amount:
            raise InsufficientFunds(f"{name} has {self._balances[name]}, needs {amount}")
        self._balances[name] -= amount

    def transfer(self, source: str, target: str, value: str | int | float | Decimal) -> None:
        """Move money from ``source`` to ``target`` atomically."""
        amount = to_amount(value)
        if self._balances[source] < amount:
            raise InsufficientFunds(f"{source} has {self._balances[source]}, needs {amount}")
        self._balances[source] -= amount
        self._balances[target] += amount
