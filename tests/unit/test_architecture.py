"""The house's rules, checked on the code itself: layered imports, no cycle, one idea per module, one registry.

- ``lint-imports`` keeps the contract in ``.importlinter``: a layers
  contract from the CLIs down to ``errors``, and no import cycle between the
  modules of any package (imports inside functions count).
- ``ruff check`` keeps pyproject.toml's ``[tool.ruff]`` rules (no ``assert``
  in library code, lines of at most 120 characters).
- Every module has a docstring, and no docstring names a module or a repository file that does not exist.
- A module of ``tfdist/`` over ``LARGE`` lines holds one idea, stated in
  ``LARGE_MODULES``; otherwise it is split by idea (never trimmed of prose).
- Only the strategy registry (``strategies/registry.py``) and the config's validation
  (``config.py``) compare a strategy's name: everywhere else asks a trait.
- No client (``segmentation``, ``fitting``) imports the start (``runtime.session``, ``runtime.lifecycle``):
  every run is assembled by ``runtime.driver``.
"""

from __future__ import annotations

import ast
import functools
import re
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
LARGE_MODULES: dict[str, str] = {}
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


#: The packages of the clients of the driver, and Keras' own fit across workers under a script's strategy: they
#: start a run through ``runtime.driver`` and ask who they are through ``runtime.who``, never through the start itself.
CLIENTS = ("tfdist.segmentation", "tfdist.fitting", "tfdist.keras_fit")
#: The modules of the one start, which the driver alone assembles.
START = ("tfdist.runtime.session", "tfdist.runtime.lifecycle")


def starts_imported_by_clients(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each client module of ``graph`` that imports a module of ``START``, with those modules."""
    return {module: sorted(targets & set(START)) for module, targets in sorted(graph.items())
            if module.startswith(CLIENTS) and targets & set(START)}


def test_no_client_imports_the_start_it_runs_through_the_driver():
    graph = import_graph()
    assert "tfdist.runtime.driver" in graph["tfdist.segmentation.experiment"]  # the UNet runs through it
    assert "tfdist.runtime.driver" in graph["tfdist.fitting.api"]  # ... and tfdist.fit
    assert starts_imported_by_clients(graph) == {}


def test_the_start_check_finds_a_client_that_imports_the_start():
    graph = {"tfdist.fitting.api": {"tfdist.runtime.session", "tfdist.runtime.driver"},
             "tfdist.keras_fit.trainer": {"tfdist.runtime.lifecycle"},
             "tfdist.runtime.driver": {"tfdist.runtime.session"}, "tfdist.deploy.local": {"tfdist.runtime.session"}}
    assert starts_imported_by_clients(graph) == {"tfdist.fitting.api": ["tfdist.runtime.session"],
                                                 "tfdist.keras_fit.trainer": ["tfdist.runtime.lifecycle"]}


#: Keras' own fit across workers: ``fixes.FIXES`` names every fix of this package and nothing outside it.
KERAS_FIT = PACKAGE / "keras_fit"
#: The modules of ``keras_fit`` with an ``install`` that are not fixes: the package's own, the trainer's fix (which
#: ``install`` calls by name, first), and the list itself.
NOT_FIXES = ("__init__", "trainer", "fixes")


def fixes_outside_and_left_out(fixes_source: str, package: dict[str, str]) -> tuple[list[str], list[str]]:
    """The modules that ``FIXES`` (assigned in ``fixes_source``) names outside ``tfdist.keras_fit``, and the
    modules of ``package`` (``{name: source}``, keras_fit's) with a top-level ``install`` or ``around`` that it
    leaves out (``NOT_FIXES`` excepted)."""
    tree = ast.parse(fixes_source)
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported |= {alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {alias.asname or alias.name: alias.name for alias in node.names}
    listed = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "FIXES" for t in node.targets))
    named = []
    for element in listed.elts:
        first, _, rest = ast.unparse(element).partition(".")
        named.append(".".join(filter(None, (imported.get(first, first), rest))))
    ours = {name.removeprefix("tfdist.keras_fit.") for name in named
            if name.startswith("tfdist.keras_fit.") and name.count(".") == 2}
    outside = [name for name in named if name.removeprefix("tfdist.keras_fit.") not in ours & set(package)]
    hooked = {name for name, source in package.items()
              if any(isinstance(node, ast.FunctionDef) and node.name in ("install", "around")
                     for node in ast.parse(source).body)}
    return outside, sorted(hooked - ours - set(NOT_FIXES))


def test_fixes_names_every_fix_of_keras_fit_and_nothing_outside():
    package = {path.stem: path.read_text() for path in KERAS_FIT.glob("*.py")}
    assert {"finish", "saving", "own_steps", "chief_files"} <= set(package)  # the package is read at all
    assert fixes_outside_and_left_out(package["fixes"], package) == ([], [])


def test_the_fixes_check_finds_a_fix_outside_and_one_left_out():
    planted = ("from tfdist.keras_fit import finish\nfrom tfdist import one_device\n"
               "from tfdist.one_device import optimizer\nFIXES = (finish, optimizer, one_device.shares)\n")
    package = {"finish": "def around(model, arguments, placement): pass", "xla": "def install(): pass",
               "trainer": "def install(fit): pass", "fixes": planted, "helpers": "def other(): pass"}
    assert fixes_outside_and_left_out(planted, package) == (
        ["tfdist.one_device.optimizer", "tfdist.one_device.shares"], ["xla"])


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_ruff_passes():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff (in the [test] extra) is not installed"
    result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


#: Names that do not exist, in module docstrings being rewritten on other branches: module -> those names. Each
#: must still be there (a test says when one goes): remove it as its docstring is rewritten.
PENDING: dict[str, tuple[str, ...]] = {}
#: Packages that setup.py maps onto a folder outside ``tfdist/`` (its ``package_dir``).
MAPPED_PACKAGES = {"tfdist.experiments": REPO / "configs" / "experiments"}
#: A path of the repository that a docstring names, e.g. docs/fit.md, configs/clusters/local_mwm.yaml.
REPO_PATH = re.compile(r"(?<![\w./-])((?:docs|configs|examples|tests|notebooks)/[\w./-]*[\w/])")
#: A file of Python named as a path, e.g. strategies/registry.py, tfdist/engine/loop.py.
PY_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py)\b")
#: A Markdown or Python file named alone, e.g. README.md, metrics.py.
BARE_FILE = re.compile(r"(?<![\w./-])([\w-]+\.(?:md|py))\b")
#: A dotted name of tfdist, e.g. tfdist.runtime.session.start.
TFDIST_NAME = re.compile(r"(?<![\w.])(tfdist(?:\.\w+)+)")
#: A dotted name in double backticks, alone or called, e.g. ``runtime.placement`` or ``agree.Report(...)``.
QUOTED_NAME = re.compile(r"``(\w+(?:\.\w+)+)(?:``|\()")
#: What ends a file's name rather than a module's (``summary.json``, ``bench.json``).
FILE_SUFFIXES = {"json", "jsonl", "yaml", "yml", "md", "py", "png", "txt", "npz", "keras", "pb", "csv", "lock"}


def _module_file(module: str) -> Path | None:
    """The file of the tfdist module or package ``module`` (dotted), or None."""
    if module in MAPPED_PACKAGES:
        return MAPPED_PACKAGES[module] if MAPPED_PACKAGES[module].is_dir() else None
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _top_level_names(path: Path) -> set[str]:
    """The names a module defines: at its top (functions, classes, assignments, imports, ``__all__``, ``_API``),
    and its classes' methods and fields."""
    if path.suffix != ".py":
        return set()
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):  # and what its instances have: ``spec.source`` of a ``ClusterSpec``
            names |= {node.name, *(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
                      *(n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id in ("__all__", "_API") for t in targets) and node.value:
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` (``tfdist.x.y...``) names a module of tfdist, or a top-level name of one.

    The parts are modules for as long as they can be; the first part after the last module must be a name that
    module defines (what follows it, an attribute of a class, is not checked).
    """
    parts = dotted.split(".")
    module, rest = parts[0], parts[1:]
    while rest and _module_file(f"{module}.{rest[0]}"):
        module, rest = f"{module}.{rest[0]}", rest[1:]
    return not rest or rest[0] in _top_level_names(_module_file(module))


@functools.cache
def _config_fields() -> set[str]:
    """``section.field`` of every field of the config's sections (``data.image_size`` of ``DataConfig``): a path
    in the config, not a module."""
    fields = set()
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and node.name != "Config":
                section = node.name.removesuffix("Config").lower()
                fields |= {f"{section}.{n.target.id}" for n in node.body
                           if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return fields


def _package_of(rel: str) -> str:
    """The dotted package that the module at ``rel`` (``tfdist/x/y.py``) lies in."""
    return ".".join(Path(rel).parent.parts)


def bad_references(rel: str, doc: str) -> list[str]:
    """The modules and repository files that ``doc``, a docstring of the module at ``rel``, names and that do not exist.

    Named are: ``tfdist.x.y``; a Python path ``x/y.py`` (from the repository, ``tfdist/`` or the module's
    folder); a repository path under docs/, configs/, examples/, tests/ or notebooks/; a bare ``NAME.md`` (at
    the repository's top or in docs/); and a dotted name in double backticks whose first part is a module of
    tfdist or of the module's own package (``runtime.placement``, ``agree.Report``).
    """
    here = (REPO / rel).parent
    bad = []
    for path in REPO_PATH.findall(doc):
        if not (REPO / path.rstrip(".")).exists():
            bad.append(path)
    for path in PY_PATH.findall(doc):
        if not any((root / path).is_file() for root in (REPO, PACKAGE, here)):
            bad.append(path)
    for name in BARE_FILE.findall(doc):
        if not any((root / name).is_file() for root in (REPO, REPO / "docs", PACKAGE, here)):
            bad.append(name)
    for dotted in TFDIST_NAME.findall(doc):
        if not _resolves(dotted):
            bad.append(dotted)
    for dotted in QUOTED_NAME.findall(doc):
        first, *_, last = dotted.split(".")
        if last in FILE_SUFFIXES or ".".join(dotted.split(".")[:2]) in _config_fields():
            continue
        for package in dict.fromkeys(("tfdist", _package_of(rel))):
            if _module_file(f"{package}.{first}") and first != "tfdist":
                if not _resolves(f"{package}.{dotted}"):
                    bad.append(dotted)
                break
    return bad


def docstrings(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of the module's docstring and of every class's and function's in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((getattr(node, "lineno", 1), doc))
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_module_has_a_docstring(path):
    assert ast.get_docstring(ast.parse(path.read_text())), (
        f"{path.relative_to(REPO)} has no module docstring: say in a line or three what the module is for")


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_docstring_names_only_modules_and_files_that_exist(path):
    rel = str(path.relative_to(REPO))
    bad = [f"line {line}: {ref}" for line, doc in docstrings(path.read_text()) for ref in bad_references(rel, doc)
           if ref not in PENDING.get(rel, ())]
    assert not bad, f"{rel}'s docstrings name modules or files that do not exist: {bad}"


def test_every_pending_reference_is_still_there():
    for rel, refs in PENDING.items():
        found = {ref for _, doc in docstrings((REPO / rel).read_text()) for ref in bad_references(rel, doc)}
        assert set(refs) <= found, f"PENDING lists {sorted(set(refs) - found)} for {rel}, which no longer names them"


def test_the_reference_check_finds_a_missing_module_or_file():
    rel = "tfdist/doctor/cli.py"
    good = ("``tfdist.fit``, tfdist.runtime.session.start, ``runtime.placement.Placement``, ``agree.Report``, "
            "strategies/registry.py, docs/fit.md, configs/experiments/, README.md, ``tfdist.experiments``, "
            "``model.fit``, ``tf.distribute.Server``")
    assert bad_references(rel, good) == []
    planted = ("tfdist.training.loop, ``runtime.lifecycl``, ``engine.controller.Nope``, engine/nothing.py, "
               "docs/internals.md, DESIGN.md, configs/clusters/missing.yaml, ``agree.Nope``")
    assert bad_references(rel, planted) == [
        "docs/internals.md", "configs/clusters/missing.yaml", "engine/nothing.py", "DESIGN.md", "tfdist.training.loop",
        "runtime.lifecycl", "engine.controller.Nope", "agree.Nope"]


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

    assert config.STRATEGIES == (*strategies.NAMES, strategies.AUTO)
    assert all(strategies.traits(name).name == name for name in strategies.NAMES)


#: Where a private TensorFlow or Keras name may be read: the compatibility module, the fix of Keras'
#: trainer, which replaces two of that module's functions (it checks their source first), and the fix of
#: Keras' optimizer across replicas, which wraps the methods that reach other replicas (it checks they exist).
COMPAT = {PACKAGE / "_compat.py", PACKAGE / "keras_fit" / "trainer.py",
          PACKAGE / "one_device" / "optimizer.py"}


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
#: process is placed (once per run, or under a script's own strategy), the doctor's flag and the benchmark's rows
#: (which name their strategy). Everything else asks the ``Placement`` or ``Traits``.
LOOKUPS = {PACKAGE / "config.py", PACKAGE / "runtime" / "session.py", PACKAGE / "runtime" / "who.py",
           PACKAGE / "doctor" / "cli.py"}


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


def _strategy_class_checks(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that test an object against a ``tf.distribute`` strategy class: ``isinstance`` with a
    class whose expression names a ``...Strategy`` (or a name bound to one), or a class name compared as a
    string."""
    bound = {target.id for node in ast.walk(tree)
             if isinstance(node, ast.Assign) and "Strategy" in ast.unparse(node.value)
             for target in node.targets if isinstance(target, ast.Name)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            if "Strategy" in ast.unparse(node.args[1]) or names & bound:
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                                                  and c.value.endswith("Strategy")
                                                  for c in [node.left, *node.comparators]):
            lines.append(node.lineno)
    return lines


def test_a_strategy_object_is_read_through_its_traits_outside_the_registry():
    found = {str(path.relative_to(REPO)): lines for path in modules() if path.parent != PACKAGE / "strategies"
             and (lines := _strategy_class_checks(ast.parse(path.read_text())))}
    assert not found, f"a strategy's class tested outside strategies/; read strategies.traits_of(strategy): {found}"


@pytest.mark.parametrize("source, caught", [
    ("isinstance(s, tf.distribute.MirroredStrategy)", True),
    ("isinstance(s, (tf.distribute.experimental.CentralStorageStrategy, int))", True),
    ("cls = tf.distribute.MultiWorkerMirroredStrategy\nisinstance(s, cls)", True),
    ("type(s).__name__ == 'MirroredStrategy'", True),
    ("isinstance(s, keras.Model)", False),
])
def test_the_strategy_class_check_finds_what_it_looks_for(source, caught):
    assert bool(_strategy_class_checks(ast.parse(source))) is caught
