"""The package's layers never loop back: no import cycle among its modules, among its folders, nor among the
root's parts (each top-level folder with everything below it, and each module of the root on its own), counting
every import statement, function-local ones included (docs/code-map.md has the order). The same three views as
the team's import_cycles.py (`pipeline`, `--folders`, `--top`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pipeline

ROOT = Path(pipeline.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports (a `from x import y` of a submodule y counts as x.y)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != "pipeline" and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def _node(module: str, view: str, mods: dict[str, Path]) -> str:
    parent = module.rpartition(".")[0]
    if view == "top":
        return ".".join(module.split(".")[:2])
    if view == "folders":
        return module if mods[module].name == "__init__.py" or parent == "pipeline" else parent
    return module


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("view", ["modules", "folders", "top"])
def test_no_import_cycle(view):
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        here = _node(name, view, mods)
        graph.setdefault(here, set()).update(
            n for n in (_node(t, view, mods) for t in _imports(name, path, mods)) if n != here and n != "pipeline")
    graph.pop("pipeline", None)
    assert _cycles(graph) == []


def test_a_cycle_is_found():
    """The check can fail: a loop through three nodes is one component."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
