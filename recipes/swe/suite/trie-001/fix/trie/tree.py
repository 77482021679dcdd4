"""The trie."""


class _Node:
    __slots__ = ("children", "terminal")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.terminal = False


class Trie:
    """A set of words supporting prefix queries."""

    def __init__(self) -> None:
        self._root = _Node()
        self._size = 0

    def insert(self, word: str) -> None:
        """Add ``word``."""
        node = self._root
        for ch in word:
            node = node.children.setdefault(ch, _Node())
        if not node.terminal:
            node.terminal = True
            self._size += 1

    def _find(self, prefix: str) -> _Node | None:
        node = self._root
        for ch in prefix:
            node = node.children.get(ch)
            if node is None:
                return None
        return node

    def __contains__(self, word: str) -> bool:
        node = self._find(word)
        return node is not None and node.terminal

    def __len__(self) -> int:
        return self._size

    def starts_with(self, prefix: str) -> list[str]:
        """All words beginning with ``prefix``, sorted."""
        node = self._find(prefix)
        found: list[str] = []
        stack = [(node, prefix)] if node else []
        while stack:
            current, text = stack.pop()
            if current.terminal:
                found.append(text)
            stack.extend((child, text + ch) for ch, child in current.children.items())
        return sorted(found)

    def remove(self, word: str) -> bool:
        """Delete ``word``; return whether it was present. Other words are unaffected."""
        path = [self._root]
        for ch in word:
            nxt = path[-1].children.get(ch)
            if nxt is None:
                return False
            path.append(nxt)
        if not path[-1].terminal:
            return False
        path[-1].terminal = False
        self._size -= 1
        for i in range(len(word), 0, -1):
            node = path[i]
            if node.children or node.terminal:
                break
            del path[i - 1].children[word[i - 1]]
        return True
