"""The flow runs one way (docs/architecture.md, "Layers"): the import graph of apps/ and workers/,
imports inside functions included, has no circle, and no lower layer imports a higher one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("apps", "workers")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of apps/ and workers/ it imports, wherever in the file it does."""
    modules = {
        _module(path): path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts and "management" not in path.parts
    }
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package up
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One circle in the graph, or [] (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_import_graph_has_no_circle() -> None:
    assert _cycle(_graph()) == []


def test_the_check_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


# Who may not import whom: (the lower layer, the higher layers it never imports).
LOWER_THAN = [
    # Backends know nothing of the portal's apps, nor of its tasks.
    ("workers.backends", ("apps", "workers.tasks")),
    # The workload host knows no kind of workload, no view and no API.
    ("apps.workloads", ("apps.jobs", "apps.compute", "apps.web", "apps.api", "apps.console", "workers.tasks")),
    # Scheduling asks for work by name: it imports no runner, view or task.
    ("apps.scheduling", ("apps.workloads.host", "apps.web", "apps.api", "apps.console", "workers.tasks")),
    # Actions and their errors raise no DRF error and import no view or task.
    ("apps.jobs.actions", ("apps.api", "apps.web", "workers")),
    ("apps.compute.actions", ("apps.api", "apps.web", "workers")),
    ("apps.errors", ("apps.api", "apps.web", "workers")),
]


@pytest.mark.parametrize(("lower", "higher"), LOWER_THAN, ids=[lower for lower, _ in LOWER_THAN])
def test_no_lower_layer_imports_a_higher_one(lower: str, higher: tuple[str, ...]) -> None:
    graph = _graph()
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module == lower or module.startswith(f"{lower}.")
        for target in targets
        if any(target == h or target.startswith(f"{h}.") for h in higher)
    )
    assert wrong == []


def test_nothing_imports_the_tasks_module() -> None:
    graph = _graph()
    assert sorted(module for module, targets in graph.items() if "workers.tasks" in targets) == []


CORE = ("engine", "preemption", "types", "ledger", "placement", "estimates", "calendar", "autoscale")


def test_the_scheduler_core_imports_no_django() -> None:
    """The engine and its parts are plain Python: the replay and the property tests run them alone."""
    allowed = {f"apps.scheduling.{name}" for name in CORE}
    for name in CORE:
        tree = ast.parse((ROOT / "apps" / "scheduling" / f"{name}.py").read_text())
        imported: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                imported.append(node.module or "")
        outside = [m for m in imported if m.split(".")[0] in ("django", "rest_framework", "apps") and m not in allowed]
        assert outside == [], name
