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

REPO = Path(__file__).resolve().parent.parent
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
