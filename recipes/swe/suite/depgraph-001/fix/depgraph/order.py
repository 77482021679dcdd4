"""Topological ordering (Kahn's algorithm)."""

import heapq
from collections.abc import Iterable, Mapping


class CycleError(ValueError):
    """The graph has a cycle; ``nodes`` are the ones that could not be ordered."""

    def __init__(self, nodes: list[str]) -> None:
        super().__init__(f"dependency cycle among: {', '.join(nodes)}")
        self.nodes = nodes


def toposort(deps: Mapping[str, Iterable[str]]) -> list[str]:
    """Nodes ordered so that each comes after all of its dependencies."""
    graph = {node: set(ds) for node, ds in deps.items()}
    for ds in list(graph.values()):
        for d in ds:
            graph.setdefault(d, set())
    dependents: dict[str, list[str]] = {node: [] for node in graph}
    for node, ds in graph.items():
        for d in ds:
            dependents[d].append(node)
    waiting = {node: len(ds) for node, ds in graph.items()}
    ready = [node for node, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for dependent in dependents[node]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, dependent)
    if len(order) != len(graph):
        raise CycleError(sorted(node for node, n in waiting.items() if n > 0))
    return order
