"""Matrix construction and arithmetic."""

Matrix = list[list[float]]


def zeros(rows: int, cols: int) -> Matrix:
    """A ``rows`` x ``cols`` matrix of zeros; every row is an independent list."""
    return [[0.0] * cols for _ in range(rows)]


def identity(n: int) -> Matrix:
    """The ``n`` x ``n`` identity matrix."""
    result = zeros(n, n)
    for i in range(n):
        result[i][i] = 1.0
    return result


def transpose(m: Matrix) -> Matrix:
    """Rows become columns."""
    return [list(col) for col in zip(*m, strict=True)]


def multiply(a: Matrix, b: Matrix) -> Matrix:
    """Matrix product ``a @ b``."""
    if len(a[0]) != len(b):
        raise ValueError(f"cannot multiply {len(a)}x{len(a[0])} by {len(b)}x{len(b[0])}")
    out = zeros(len(a), len(b[0]))
    for i in range(len(a)):
        for j in range(len(b[0])):
            out[i][j] = sum(a[i][k] * b[k][j] for k in range(len(b)))
    return out


def trace(m: Matrix) -> float:
    """Sum of the diagonal of a square matrix."""
    return sum(m[i][i] for i in range(len(m)))
