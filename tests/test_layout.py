"""The layering the package promises: no import cycles, a core that imports nothing above it, and the three entry
points running their graphs through the one core (read off the sources: no import is executed)."""

from __future__ import annotations

import ast
from pathlib import Path

import launchless

ROOT = Path(launchless.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the launchless modules it imports (``from . import x`` imports ``x``, not its package)."""
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                children = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in paths]
                found = children or ([target] if target in paths else [])
            elif isinstance(node, ast.Import):
                found = [alias.name for alias in node.names if alias.name in paths]
            else:
                continue
            graph[name].update(t for t in found if t != name)
    return graph


def test_no_module_imports_itself_back() -> None:
    graph = import_graph()
    cycles = []

    def visit(module: str, path: list[str], state: dict[str, int]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target], state)
        state[module] = 2

    state: dict[str, int] = {}
    for module in sorted(graph):
        if module not in state:
            visit(module, [module], state)
    assert cycles == []


def test_the_core_imports_nothing_above_it_but_the_leaves_it_shares() -> None:
    graph = import_graph()
    above = {t for m, targets in graph.items() if m.startswith("launchless.core") for t in targets}
    # import nothing of launchless themselves: source lines, errors, and the speed judgement (a swap records it)
    shared_leaves = {"launchless.diagnose.source", "launchless.errors", "launchless.timing"}
    assert {t for t in above if not t.startswith("launchless.core")} == shared_leaves
    assert all(graph[leaf] == set() for leaf in shared_leaves)


def test_the_three_entry_points_run_their_graphs_through_the_core_cache() -> None:
    graph = import_graph()
    for policy in (
        "launchless.runtime.graphed_module",
        "launchless.runtime.decode_steps",
        "launchless.train.step",
        "launchless.compiler.compiled_graphs",
    ):
        assert "launchless.core.cache" in graph[policy], policy
    users = {m for m, targets in graph.items() if "launchless.core.capture" in targets}
    assert users <= {
        "launchless.core.cache",
        "launchless.core.verify",
        "launchless.core.compiled_programs",  # its capture lock only: a program's kernels load between captures
        "launchless.runtime.graphed_module",
        "launchless.runtime.capture_flow",
        "launchless.runtime.compiled_kernels",
        "launchless.runtime.decode_kernels",
        "launchless.runtime.decode_steps",
        "launchless.train.capture_levels",
        "launchless.train.step_runs",
        "launchless.train.hooks",
        "launchless.compiler.compiled_graphs",
        "launchless.compiler.variants",
        "launchless.diagnose.messages",
    }, users
    library = [p for p in ROOT.rglob("*.py") if "apps" not in p.relative_to(ROOT).parts]  # apps: the benchmarks' own
    cuda_graph_users = [module_name(p) for p in library if "torch.cuda.CUDAGraph(" in p.read_text()]
    assert cuda_graph_users == ["launchless.core.capture"]  # hand-written graphs are a benchmark mode
