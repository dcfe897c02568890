"""The package's modules import one way: no circle through easy_context's own modules, counting the imports inside
functions (a lazy import hides a circle from Python, not from the reader), and no module keeps a week-old path
alive (easy_context/_moved.py is gone). Static: the sources are parsed, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "easy_context"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """{module: the easy_context modules it imports anywhere in its source}."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    deps.add(target if target in modules else base)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_in_a_circle():
    graph = import_graph()
    assert "easy_context.core.documents" in graph and "easy_context.core.spans" in graph["easy_context.core.documents"]
    found = circles(graph)
    assert not found, "import circles (counting imports inside functions): " + "; ".join(" <-> ".join(c) for c in found)


def test_the_moved_module_shim_is_gone():
    assert not (ROOT / "_moved.py").exists()
    assert not any("_moved" in deps for deps in map(str, import_graph().values()))


def unit(module: str) -> str:
    """The package a module belongs to, one level under easy_context (``easy_context.core.documents`` -> ``core``;
    a top-level module is its own unit; the package's ``__init__`` is ``easy_context``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, deps in import_graph().items():
        graph.setdefault(unit(module), set()).update(unit(d) for d in deps if unit(d) != unit(module))
    return graph


# a unit may never import these (counting imports inside functions): data flows down the floors
NEVER = {
    "core": {"backends", "legacy", "hf", "loss", "memory", "training", "data", "tasks", "eval", "plan", "sp_config"},
    "kernels": {"core", "backends", "legacy", "hf", "training", "data", "eval", "models"},
    "comm": {"core", "backends", "legacy", "hf", "training", "data", "eval", "models"},
    "backends": {"legacy", "hf", "loss", "memory", "training", "data", "tasks", "eval", "plan", "sp_config"},
    "models": {"core", "backends", "legacy", "hf", "training", "data", "eval", "plan"},
    "tasks": {"data", "eval", "training", "backends", "legacy"},
    "data": {"eval", "training", "backends", "legacy"},
    "hf": {"training", "eval", "data", "legacy", "backends"},
    "plan": {"training", "eval", "data", "legacy", "backends"},
    "training": {"eval", "legacy"},
}


def test_imports_run_down_the_floors():
    graph = unit_graph()
    assert {"core", "backends", "data", "eval", "tasks", "models", "legacy"} <= set(graph)
    broken = [f"{a} -> {b}" for a, never in NEVER.items() for b in sorted(graph.get(a, set()) & never)]
    assert not broken, "imports against the floors: " + ", ".join(broken)
    legacy_users = sorted(u for u, deps in graph.items() if "legacy" in deps and u not in ("easy_context", "legacy"))
    assert not legacy_users, f"only the package face imports the compatibility layer, not {legacy_users}"


def test_no_package_imports_in_a_circle():
    """Between packages too: a circle of packages (a imports b, b imports a) is an import running back up."""
    assert circles(unit_graph()) == []


def test_the_backends_live_in_one_package():
    backends = ROOT / "backends"
    assert {p.name for p in backends.iterdir() if (p / "__init__.py").exists()} == {
        "zigzag_ring_attn", "dist_flash_attn", "ulysses_attn", "usp_attn", "data_parallel"
    }  # fmt: skip
    assert not any(
        (ROOT / name).exists() for name in ("zigzag_ring_attn", "dist_flash_attn", "ulysses_attn", "usp_attn")
    )
