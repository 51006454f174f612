"""The package's layers, read from its imports (every import statement, lazy and
TYPE_CHECKING ones too): no module imports itself back through others, and the backends
(the CPU kernels' driver, the CUDA path, the Dask path) never reach the public functions
or the dispatch, so a backend cannot call back into the public layer."""

from __future__ import annotations

import ast

from helpers import REPO

PACKAGE = REPO / "fastattn"
PUBLIC = {"_sdpa", "_family", "_varlen", "_mha", "_dispatch"}
BACKENDS = ("_cpu", "_cuda", "_dask")


def _imports() -> dict[str, set[str]]:
    """fastattn's modules (top level, not fastattn.bench) -> the fastattn modules they import."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph = {}
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "fastattn":
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastattn."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {
                    a.name.split(".")[1] for a in node.names if a.name.startswith("fastattn.")
                }
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _reachable(graph: dict, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def test_no_import_circles():
    graph = _imports()
    circles = sorted(m for m in graph if m in _reachable(graph, m))
    assert not circles, f"modules that import themselves back through others: {circles}"


def test_backends_never_reach_the_public_layer():
    graph = _imports()
    for backend in BACKENDS:
        reached = _reachable(graph, backend) & PUBLIC
        assert not reached, f"fastattn/{backend}.py reaches {sorted(reached)}"
