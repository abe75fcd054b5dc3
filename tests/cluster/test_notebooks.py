"""The notebooks run top to bottom in a real Jupyter kernel, and are committed without outputs.

Each notebook is executed by nbclient in a fresh ``ipykernel`` started with this
test's own Python (``sys.executable``), through a kernelspec written to a
temporary directory: the ``python3`` kernelspec found on the Jupyter path may
belong to another environment, and nothing here needs the network. The
notebooks read their size from ``TFDIST_NOTEBOOK_STEPS`` and write their runs
under ``TFDIST_NOTEBOOK_RUNS``; the kernel inherits both from this process.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from unit.test_notebooks import NOTEBOOKS, NOTEBOOKS_DIR


#: Training steps each notebook runs under test: TensorFlow start-up and tracing dominate anyway.
TEST_STEPS = "8"
#: Seconds one cell may run before the notebook fails.
CELL_TIMEOUT = 480


def _kernel_manager(kernel_dir: Path):
    """A KernelManager for an ipykernel running this interpreter, from a kernelspec in ``kernel_dir``."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec_dir = kernel_dir / "tfdist-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "tfdist test kernel",
        "language": "python",
    }))
    specs = KernelSpecManager(kernel_dirs=[str(kernel_dir)])
    return KernelManager(kernel_name="tfdist-test", kernel_spec_manager=specs)


def _errors(notebook) -> list[str]:
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append(f"cell {index}: {output['ename']}: {output['evalue']}")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_top_to_bottom(path, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("TFDIST_NOTEBOOK_STEPS", TEST_STEPS)
    monkeypatch.setenv("TFDIST_NOTEBOOK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    notebook = nbformat.read(path, as_version=4)
    km = _kernel_manager(tmp_path / "kernels")
    client = NotebookClient(
        notebook, km=km, timeout=CELL_TIMEOUT, allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed after {time.perf_counter() - start:.0f} s:\n{e}")
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    assert not _errors(notebook)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code_cells), "a code cell did not run"
    # Every notebook shows at least one figure (images, masks, charts).
    assert any(
        "image/png" in output.get("data", {}) for c in code_cells for output in c.outputs
    ), f"{path.name} displayed no figure"
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")
