"""The import graph of lipbound: no cycles, and every layer imports only the layers below it.

Usage::

    python scripts/import_graph.py          # prints the package graph, cycles and violations
    python scripts/import_graph.py --dot    # the module graph in Graphviz format

Every ``import`` and ``from ... import`` of every module is read with :mod:`ast`, at module
level and inside functions alike (a function-local import may not hide a cycle).  Layers, from
the bottom (a layer may import the layers before it)::

    errors, io  <  rigorous  <  symbolic  <  printing  <  numeric  <  local  <  measures  <  advise  <  cli

with two more rules: the symbolic and printing layers import no numeric code, cvxpy or scipy.
Only the CLI may import lazily inside functions (to keep ``lipbound derive`` fast).  Exit status 0
when the graph is clean, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "lipbound"
LAYERS = ["errors", "io", "rigorous", "symbolic", "printing", "numeric", "local", "measures", "advise", "cli"]
RANK = {name: rank for rank, name in enumerate(LAYERS)}
RANK["io"] = RANK["errors"]  # the two base modules do not import each other's layers
FORBIDDEN = {"symbolic": ("cvxpy", "scipy"), "printing": ("cvxpy", "scipy"), "rigorous": ("cvxpy", "scipy")}
TOP_LEVEL = {"lipbound", "lipbound.__init__"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[str, bool, int]]:
    """``(imported module, inside a function, line)`` for every import statement of a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []

    def visit(node, nested: bool):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, nested, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.append((target, nested, child.lineno))
                for alias in child.names:  # `from . import symbols` imports a module
                    candidate = f"{target}.{alias.name}"
                    if (root.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or \
                            (root.parent / Path(*candidate.split("."))).is_dir():
                        found.append((candidate, nested, child.lineno))
            visit(child, inner)

    visit(tree, False)
    return found


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "lipbound" else None


def build(root: Path = ROOT) -> tuple[dict, list[str]]:
    """The module graph of the package at ``root`` and the rule violations found."""
    graph: dict[str, set[str]] = {}
    problems = []
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    for name, path in sorted(modules.items()):
        graph.setdefault(name, set())
        own = layer(name)
        for target, nested, line in imports(path, root):
            if target.startswith("lipbound"):
                resolved = target if target in modules else target.rsplit(".", 1)[0]
                if resolved not in modules or resolved == name:
                    continue
                graph[name].add(resolved)
                other = layer(resolved)
                if own in RANK and other in RANK and RANK[other] > RANK[own]:
                    problems.append(f"{name}:{line} imports {resolved} (layer {other} is above {own})")
                if nested and own != "cli":
                    problems.append(f"{name}:{line} imports {resolved} inside a function")
            else:
                top = target.split(".")[0]
                if top in FORBIDDEN.get(own, ()):
                    problems.append(f"{name}:{line} imports {target} (the {own} layer imports no {top})")
    return graph, problems


def cycles(graph: dict) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def strongconnect(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                strongconnect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dot", action="store_true", help="print the module graph in Graphviz format")
    args = parser.parse_args(argv)
    graph, problems = build()
    found = cycles(graph)
    if args.dot:
        print("digraph lipbound {")
        for node, targets in sorted(graph.items()):
            for target in sorted(targets):
                print(f'  "{node}" -> "{target}";')
        print("}")
        return 0
    packages: dict[str, set[str]] = {}
    for node, targets in graph.items():
        for target in targets:
            if layer(node) != layer(target):
                packages.setdefault(layer(node) or "lipbound", set()).add(layer(target) or "lipbound")
    print(f"{len(graph)} modules, {sum(len(t) for t in graph.values())} imports between them")
    for name in LAYERS:
        print(f"  {name:9s} imports {', '.join(sorted(packages.get(name, ()))) or '-'}")
    print(f"cycles: {len(found)}" + "".join(f"\n  {' <-> '.join(c)}" for c in found))
    print(f"layer violations: {len(problems)}" + "".join(f"\n  {p}" for p in problems))
    return 0 if not found and not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
