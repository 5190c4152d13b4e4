"""The package's imports go one way, down the layers (docs/architecture.md): no module imports one above it, no two
modules import each other through any path, and no function imports a module of the project except where the
import is deferred for its cost (a comment saying "import cost" on the line or the one above)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "alibi_lm"

# Bottom to top; a module belongs to the layer of the longest prefix that names it. A module may import its own
# layer (sideways) or any layer below.
LAYERS = [
    ["alibi_lm", "alibi_lm.errors", "alibi_lm.labels", "alibi_lm.registry", "alibi_lm.special_tokens"],
    ["alibi_lm.checkpoint", "alibi_lm.provenance", "alibi_lm.stopping", "alibi_lm.costs", "alibi_lm.vocab",
     "alibi_lm.optim"],
    ["alibi_lm.positions"],
    ["alibi_lm.extension", "alibi_lm.attention", "alibi_lm.model"],
    ["alibi_lm.tasks"],
    ["alibi_lm.config"],
    ["alibi_lm.fairseq_format", "alibi_lm.data"],
    ["alibi_lm.subjects"],
    ["alibi_lm.results"],
    ["alibi_lm.eval"],
    ["alibi_lm.training"],
    ["alibi_lm.cli", "alibi_lm.naming"],
    ["alibi_lm.probes"],
    ["alibi_lm.train", "alibi_lm.eval.app", "alibi_lm.eval.__main__", "alibi_lm.probes.app", "alibi_lm.probes.__main__",
     "alibi_lm.results.__main__", "alibi_lm.positions.__main__", "alibi_lm.tasks.__main__", "alibi_lm.fairseq_import"],
    ["alibi_lm.plans", "alibi_lm.bench", "alibi_lm.finished"],
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    best = max((prefix for layer in LAYERS for prefix in layer
                if module == prefix or module.startswith(prefix + ".")), key=len, default=None)
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)"
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The project modules an import statement of `module` loads (a package's __init__ included)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")
            is_package = MODULES[module].name == "__init__.py"
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
    out = []
    for name in names:
        while name and name not in MODULES:  # alibi_lm.x.y where y is not a module: alibi_lm.x
            name = name.rpartition(".")[0]
        if name.startswith("alibi_lm"):
            out.append(name)
    return out


def imports() -> list[tuple[str, str, int, bool]]:
    """(importer, imported, line, inside a function) for every import of a project module."""
    found = []
    for module, path in MODULES.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        local = {id(n) for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if id(node) in local and "import cost" in " ".join(lines[max(0, node.lineno - 2): node.lineno]):
                    continue  # deferred for its cost, said so
                for target in resolve(module, node):
                    if target != module:
                        found.append((module, target, node.lineno, id(node) in local))
    return found


IMPORTS = imports()


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


def test_no_import_goes_up_a_layer():
    upward = [f"{a} (line {line}) imports {b}" for a, b, line, _ in IMPORTS
              if layer_of(b) > layer_of(a) and not a.startswith(b + ".")]
    assert not upward, "imports that go up:\n" + "\n".join(upward)


def test_no_function_imports_a_project_module():
    local = [f"{a} (line {line}) imports {b} inside a function" for a, b, line, inside in IMPORTS if inside]
    assert not local, ("move these imports to the top of the module (or say '# import cost' beside one deferred "
                       "for its import time):\n" + "\n".join(local))


def test_no_import_cycle():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b, _, _ in IMPORTS:
        graph[a].add(b)
    for module in MODULES:  # a module's import loads its package's __init__ first
        parent = module.rpartition(".")[0]
        if parent in MODULES and MODULES[module].name != "__init__.py":
            graph[module].add(parent)
    for package, path in MODULES.items():  # but a package's __init__ re-exporting its own submodules is no cycle
        if path.name == "__init__.py":
            graph[package] = {m for m in graph[package] if not m.startswith(package + ".")}
    # Tarjan's strongly connected components: any with two or more modules is a cycle
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


# Within a layer, the packages whose modules stack: each imports only the modules before it (docs/architecture.md)
ORDERED_PACKAGES = {"alibi_lm.attention": ["flex_kernel", "context", "kernels", "backend"]}


def out_of_order(found, package: str, order: list[str]) -> list[str]:
    rank = {f"{package}.{name}": i for i, name in enumerate(order)}
    return [f"{a} (line {line}) imports {b}, which comes after it" for a, b, line, _ in found
            if a in rank and b in rank and rank[b] >= rank[a]]


@pytest.mark.parametrize("package", ORDERED_PACKAGES)
def test_an_ordered_package_imports_only_down_its_order(package):
    order = ORDERED_PACKAGES[package]
    assert {m for m in MODULES if m.startswith(package + ".")} == {f"{package}.{name}" for name in order}
    wrong = out_of_order(IMPORTS, package, order)
    assert not wrong, "\n".join(wrong)
    # the check itself: flex_kernel importing backend would be found
    planted = [("alibi_lm.attention.flex_kernel", "alibi_lm.attention.backend", 1, False)]
    assert out_of_order(planted, "alibi_lm.attention", ORDERED_PACKAGES["alibi_lm.attention"])


@pytest.mark.parametrize("upward", ["from ..cli import main", "from alibi_lm.train import train"])
def test_the_check_sees_an_upward_import(upward, tmp_path, monkeypatch):
    """The checker itself: an app imported from the model layer is found."""
    node = ast.parse(upward).body[0]
    targets = resolve("alibi_lm.positions.alibi", node)
    assert targets and all(layer_of(t) > layer_of("alibi_lm.positions.alibi") for t in targets)
