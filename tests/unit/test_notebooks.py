"""The committed notebooks: there are some, and none holds outputs."""

from __future__ import annotations


import pytest
from helpers.clis import REPO


NOTEBOOKS_DIR = REPO / "notebooks"


NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:2] == ["01_quickstart.ipynb", "02_strategies.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_has_no_outputs(path):
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} has outputs: strip them before committing"
            assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"

