"""Tiny dense-matrix helpers."""

from matrix.ops import Matrix, identity, multiply, trace, transpose, zeros

__all__ = ["Matrix", "identity", "multiply", "trace", "transpose", "zeros"]
