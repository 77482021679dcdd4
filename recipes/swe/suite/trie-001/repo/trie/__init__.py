"""Prefix tree."""

from trie.tree import Trie

__all__ = ["Trie"]
