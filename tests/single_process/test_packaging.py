"""A wheel built from the repository, installed elsewhere, runs the quick experiment."""

import shutil
from pathlib import Path

import pytest
import yaml

from helpers.clis import REPO, run_cli, run_python
from unit.test_packaging import EXPERIMENTS, NAMES


@pytest.mark.slow
def test_wheel_installed_elsewhere_runs_config_quick(tmp_path):
    # The wheel is built from a copy of the checkout, so that no build/ or *.egg-info is
    # left in the checkout (nor a stale build/lib from an earlier build shipped in this one),
    # and without build isolation, so that no package index is needed.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", "runs", ".venv"))
    pip_env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    run_python(["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", ".", "-w", str(wheels)],
               cwd=source, timeout=300, env=pip_env, check=True)
    (wheel,) = wheels.glob("tfdist-*.whl")
    run_python(["-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)], cwd=tmp_path, timeout=120,
               env=pip_env, check=True)
    assert sorted(p.name for p in (site / "tfdist" / "experiments").glob("*.yaml")) == [f"{n}.yaml" for n in NAMES]

    # From a third folder, with only the installed copy on the path (not the checkout).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(site)}
    probe = run_python((
        "import tfdist\n"
        "from tfdist import config\n"
        "print(tfdist.__file__)\n"
        "print(config.resolve_experiment_path('quick'))\n"
        "try:\n"
        "    config.resolve_experiment_path('no_such_experiment')\n"
        "except Exception as e:\n"
        "    print(e)\n"
    ), cwd=elsewhere, timeout=60, env=env, check=True)
    module, quick, error = probe.stdout.splitlines()
    assert Path(module) == site / "tfdist" / "__init__.py"
    assert Path(quick) == site / "tfdist" / "experiments" / "quick.yaml"
    assert f"one of: {', '.join(NAMES)}." in error

    model_dir = tmp_path / "run"
    run_cli("tfdist.train", "--config", "quick", "--strategy", "one_device", f"--model_dir={model_dir}", "--noexport",
            cwd=elsewhere, timeout=300, env=env, check=True)
    assert (model_dir / "summary.json").is_file()
    params = yaml.safe_load((model_dir / "params.yaml").read_text())
    quick_values = yaml.safe_load((EXPERIMENTS / "quick.yaml").read_text())
    for section, values in quick_values.items():
        for name, value in values.items():
            assert params[section][name] == value, f"{section}.{name}"

