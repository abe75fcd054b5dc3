"""The house's rules, checked on the code itself: layered imports, no cycle, one idea per module, one registry.

- ``lint-imports`` keeps the contract in ``.importlinter``: a layers
  contract from the CLIs down to ``errors``, and no import cycle between the
  modules of any package (imports inside functions count).
- ``ruff check`` keeps pyproject.toml's ``[tool.ruff]`` rules (no ``assert``
  in library code, lines of at most 120 characters).
- A module's docstring says what and why in at most ``DOCSTRING_LINES`` lines.
- A module of ``tfdist/`` over ``LARGE`` lines holds one idea, stated in
  ``LARGE_MODULES``; otherwise it is split by idea (never trimmed of prose).
- Only the strategy registry (``strategies/registry.py``) and the config's validation
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
#: Past this many lines a module is checked for holding one idea.
LARGE = 400
#: Modules over ``LARGE`` lines (path relative to the repository) -> the one idea each holds, in one line.
LARGE_MODULES: dict[str, str] = {
    "tfdist/config.py": "the run's configuration: its four sections, how experiment files and flags set them, "
                        "and validate(), the one check of every value before anything starts",
}
#: The modules allowed to compare strategy names.
REGISTRY = {PACKAGE / "strategies" / "registry.py", PACKAGE / "config.py"}


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
    assert "tfdist.segmentation.evaluator" in graph["tfdist.segmentation.experiment"]  # ... and inside functions
    assert _cycle(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_ruff_passes():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff (in the [test] extra) is not installed"
    result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


#: A module's docstring says what it does and why in at most this many lines; the long form is docs/internals.md.
DOCSTRING_LINES = 10


def _long_docstring(rel: str, source: str) -> str:
    """Why the module docstring of ``source`` breaks the short-docstring rule, or "" when it keeps it."""
    doc = ast.get_docstring(ast.parse(source), clean=False)
    if doc is None:
        return f"{rel} has no module docstring: say in a few lines what it does and why"
    lines = len(doc.strip().splitlines())
    if lines > DOCSTRING_LINES:
        return (f"{rel}'s module docstring has {lines} lines (over {DOCSTRING_LINES}): keep what and why there, "
                "and move the long form to docs/internals.md")
    return ""


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_module_docstring_says_what_and_why_in_a_few_lines(path):
    problem = _long_docstring(str(path.relative_to(REPO)), path.read_text())
    assert not problem, problem


def test_the_docstring_rule_finds_a_long_and_a_missing_docstring():
    long = '"""One.\n\n' + "more\n" * DOCSTRING_LINES + '"""\n'
    assert "over 10" in _long_docstring("tfdist/x.py", long)
    assert "no module docstring" in _long_docstring("tfdist/x.py", "x = 1\n")
    assert _long_docstring("tfdist/x.py", '"""One line."""\n') == ""


def _large_without_an_idea(rel: str, lines: int, allowed: dict[str, str]) -> str:
    """Why a module of ``lines`` lines at ``rel`` breaks the one-idea rule, or "" when it keeps it."""
    if lines <= LARGE or allowed.get(rel, "").strip():
        return ""
    return (f"{rel} has {lines} lines (over {LARGE}) and no statement of its one idea: split it by idea, or, "
            "if it holds one idea, add it to LARGE_MODULES in tests/unit/test_architecture.py with that idea in one line")


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_large_module_holds_one_stated_idea(path):
    rel = str(path.relative_to(REPO))
    problem = _large_without_an_idea(rel, len(path.read_text().splitlines()), LARGE_MODULES)
    assert not problem, problem


def test_the_size_rule_names_the_file_and_asks_for_a_split_by_idea():
    problem = _large_without_an_idea("tfdist/x.py", LARGE + 1, {})
    assert "tfdist/x.py" in problem and "split it by idea" in problem
    assert _large_without_an_idea("tfdist/x.py", LARGE + 1, {"tfdist/x.py": " "})  # a blank statement is none
    assert _large_without_an_idea("tfdist/x.py", LARGE + 1, {"tfdist/x.py": "the TF_CONFIG schema"}) == ""
    assert _large_without_an_idea("tfdist/x.py", LARGE, {}) == ""


def test_every_stated_large_module_exists_and_is_large():
    for rel, idea in LARGE_MODULES.items():
        path = REPO / rel
        assert path.is_file(), f"LARGE_MODULES lists {rel}, which is not a file: remove it"
        assert "\n" not in idea.strip(), f"LARGE_MODULES states {rel}'s idea in more than one line"
        assert len(path.read_text().splitlines()) > LARGE, f"{rel} is no longer over {LARGE} lines: remove it"


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


#: Where a private TensorFlow or Keras name may be read: the compatibility module, the fix of Keras'
#: trainer, which replaces two of that module's functions (it checks their source first), and the fix of
#: Keras' optimizer across replicas, which wraps the methods that reach other replicas (it checks they exist).
COMPAT = {PACKAGE / "_compat.py", PACKAGE / "fitting" / "patch" / "trainer.py",
          PACKAGE / "fitting" / "global_gradients.py"}


def _private_reaches(path: Path) -> list[str]:
    """Private imports (``tensorflow.python``, ``keras.src``) and ``obj._name`` reads of other objects in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("tensorflow.python", "keras.src")):
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith(("tensorflow.python", "keras.src"))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            mine = isinstance(owner, ast.Name) and owner.id in ("self", "cls", "os", "sys")
            parent = isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"
            if not (mine or parent):
                found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("path", [p for p in modules() if p not in COMPAT], ids=lambda p: str(p.relative_to(REPO)))
def test_private_tensorflow_and_keras_names_are_read_only_in_the_compatibility_module(path):
    reaches = _private_reaches(path)
    assert not reaches, f"{path.relative_to(REPO)} reaches into private names; move them to tfdist/_compat.py: {reaches}"


#: Where a strategy's traits are looked up by name: the registry's package, the config's validation, where a
#: process is placed (once per run), the doctor's flag and the benchmark's rows (which name their strategy).
#: Everything else asks the ``Placement`` or ``Traits``.
LOOKUPS = {PACKAGE / "config.py", PACKAGE / "runtime" / "session.py", PACKAGE / "doctor" / "cli.py"}


def test_a_strategy_is_looked_up_by_name_only_where_a_run_is_placed():
    calls = {}
    for path in modules():
        if path in LOOKUPS or path.parent in (PACKAGE / "strategies", PACKAGE / "bench"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "traits" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "strategies":
                calls.setdefault(str(path.relative_to(REPO)), []).append(node.lineno)
            elif isinstance(node, ast.ImportFrom) and node.module == "tfdist.strategies" \
                    and any(a.name == "traits" for a in node.names):
                calls.setdefault(str(path.relative_to(REPO)), []).append(node.lineno)
    assert not calls, f"strategies.traits(name) outside the placement; ask the Placement or its Traits: {calls}"
