"""The house's rules, checked on the code itself: layered imports, no cycle, small modules, one strategy registry.

- ``lint-imports`` keeps the contract in ``.importlinter``: a layers
  contract from the CLIs down to ``errors``, and no import cycle between the
  modules of any package (imports inside functions count).
- No module of ``tfdist/`` is over 400 lines.
- Only the strategy registry (``strategies.py``) and the config's validation
  (``config.py``) compare a strategy's name: everywhere else asks a trait.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tfdist import strategies
from helpers.clis import REPO

PACKAGE = REPO / "tfdist"
MAX_LINES = 400
#: The modules allowed to compare strategy names.
REGISTRY = {PACKAGE / "strategies.py", PACKAGE / "config.py"}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_import_contract_is_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "lint-imports (import-linter, in the [test] extra) is not installed"
    result = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "2 kept, 0 broken" in result.stdout


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """tfdist module -> the tfdist modules it imports, anywhere in it (inside functions too).

    ``from a.b import c`` is an import of ``a.b.c`` when that is a module, else of ``a.b``.
    """
    names = {_module_name(p) for p in modules()}
    graph: dict[str, set[str]] = {}
    for path in modules():
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names}
        graph[module] = {t for t in targets if t in names and t != module}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (as a path that ends where it starts), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_no_import_cycle_in_tfdist_even_inside_functions():
    graph = import_graph()
    assert "tfdist.cluster.task" in graph["tfdist.cluster.sources"]  # the graph sees imports at all
    assert "tfdist.training.evaluator" in graph["tfdist.training.experiment"]  # ... and inside functions
    assert _cycle(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_is_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def _compared_strategy_names(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of every strategy name that a comparison (``==``, ``!=``, ``in``, ``not in``) uses."""
    names = set(strategies.NAMES)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for operand in [node.left, *node.comparators]:
            values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            found += [(node.lineno, v.value) for v in values
                      if isinstance(v, ast.Constant) and v.value in names]
    return found


@pytest.mark.parametrize("path", [p for p in modules() if p not in REGISTRY], ids=lambda p: str(p.relative_to(REPO)))
def test_no_strategy_name_is_compared_outside_the_registry(path):
    assert _compared_strategy_names(ast.parse(path.read_text())) == []


def test_the_name_check_finds_a_comparison():
    planted = 'if rt.strategy == "parameter_server" or x in ("mirrored", "a"): pass'
    assert _compared_strategy_names(ast.parse(planted)) == [(1, "parameter_server"), (1, "mirrored")]


def test_config_takes_its_strategy_names_from_the_registry():
    from tfdist import config

    assert config.STRATEGIES == strategies.NAMES
    assert all(strategies.traits(name).name == name for name in strategies.NAMES)
