"""tag_core's imports run one way: from the CLI down to the stages, from later stages to earlier ones.

Read from the source with `ast` (lazy imports inside functions count too), so a violation
fails here before it shows up as an import cycle at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tag_core"

# Modules every stage may use; they import no stage of tag_core.
FOUNDATION = {"tag_core", "tag_core.artifacts", "tag_core.errors", "tag_core.files", "tag_core.limits",
              "tag_core.disjoint_sets", "tag_core.tf_children",
              "tag_core.tf_zygote"}

# The stages in pipeline order. A stage may import itself, the foundation and earlier rows;
# stages on one row are independent of each other.
LAYERS = [
    ("store",),
    ("capture",),
    ("cluster",),
    ("profile",),
    ("simulate",),
    ("search",),
    ("sfb", "fusion"),
    ("plan",),
    ("gnn", "emit"),
    ("runtime",),
    ("train",),
    ("report",),
    ("cli",),
]
# Short public paths that belong to a stage: user model files import `tag_core.models`.
ALIASES = {"tag_core.models": "capture"}
RANK = {stage: rank for rank, row in enumerate(LAYERS, start=1) for stage in row}
ADAPTERS = ("assets", "sensors", "tag_pipelines", "dagster")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, absolute, including imports inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # `from package import module` depends on the module itself
            found.update(f"{target}.{alias.name}" for alias in node.names if is_module(f"{target}.{alias.name}"))
    return found


def stage_of(module: str) -> str | None:
    if module in ALIASES:
        return ALIASES[module]
    if module in FOUNDATION:
        return None
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tag_core" else None


def rank_of(module: str) -> int:
    stage = stage_of(module)
    if stage is None:
        return 0
    if stage not in RANK:
        raise AssertionError(f"{module}: the stage {stage!r} is not in LAYERS; add it where it belongs")
    return RANK[stage]


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        graph[module_name(path)] = imports_of(path)
    return graph


GRAPH = import_graph()


def back_imports(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in graph.items():
        for target in sorted(targets):
            if target.split(".")[0] in ADAPTERS:
                problems.append(f"{module} imports {target}: tag_core never imports Dagster or its adapters")
            if not target.startswith("tag_core") or target == module:
                continue
            here, there = rank_of(module), rank_of(target)
            if there > here or (there == here and stage_of(target) != stage_of(module)):
                problems.append(f"{module} imports {target}, which runs back (or across) the stages")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_stage_is_placed():
    stages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert stages == set(RANK), "tag_core's packages and LAYERS differ"
    modules = {module_name(path) for path in PACKAGE.glob("*.py")}
    assert modules == FOUNDATION | set(ALIASES), "a module at tag_core's top level belongs in a stage"


def test_imports_run_one_way():
    assert back_imports(GRAPH) == []


def test_no_module_level_cycle():
    assert cycles(GRAPH) == []


def test_checker_catches_back_imports_and_cycles():
    # The checker itself, on a made-up graph: a back import, a sideways one, a cycle, dagster.
    graph = {
        "tag_core.capture.graph": {"tag_core.simulate.cost"},
        "tag_core.sfb.milp": {"tag_core.fusion.patterns"},
        "tag_core.simulate.cost": {"tag_core.simulate.engine"},
        "tag_core.simulate.engine": {"tag_core.simulate.cost"},
        "tag_core.store": {"dagster"},
    }
    problems = back_imports(graph)
    assert any("tag_core.capture.graph imports tag_core.simulate.cost" in p for p in problems)
    assert any("tag_core.sfb.milp imports tag_core.fusion.patterns" in p for p in problems)
    assert any("dagster" in p for p in problems)
    assert cycles(graph) == [["tag_core.simulate.cost", "tag_core.simulate.engine"]]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 450, f"{path.name} has {lines} lines: split the second concept out"


@pytest.mark.parametrize("stage", sorted(RANK))
def test_each_stage_says_what_goes_in_and_out(stage):
    doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text()))
    assert doc and "In:" in doc and "Out:" in doc, f"tag_core/{stage}/__init__.py: say what goes in (In:) and what comes out (Out:)"
