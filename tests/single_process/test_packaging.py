"""A wheel built from the repository, installed elsewhere, runs the quick experiment."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.clis import REPO
from unit.test_packaging import EXPERIMENTS, NAMES


def _run(args, *, cwd, timeout, env=None):
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, args))} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.slow
def test_wheel_installed_elsewhere_runs_config_quick(tmp_path):
    # The wheel is built from a copy of the checkout, so that no build/ or *.egg-info is
    # left in the checkout (nor a stale build/lib from an earlier build shipped in this one),
    # and without build isolation, so that no package index is needed.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", "runs", ".venv"))
    pip_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    _run(["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", ".", "-w", str(wheels)],
         cwd=source, timeout=300, env=pip_env)
    (wheel,) = wheels.glob("tfdist-*.whl")
    _run(["-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)], cwd=tmp_path, timeout=120,
         env=pip_env)
    assert sorted(p.name for p in (site / "tfdist" / "experiments").glob("*.yaml")) == [f"{n}.yaml" for n in NAMES]

    # From a third folder, with only the installed copy on the path (not the checkout).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "TF_CPP_MIN_LOG_LEVEL": "2"}
    probe = _run(["-c", (
        "import tfdist\n"
        "from tfdist import config\n"
        "print(tfdist.__file__)\n"
        "print(config.resolve_experiment_path('quick'))\n"
        "try:\n"
        "    config.resolve_experiment_path('no_such_experiment')\n"
        "except Exception as e:\n"
        "    print(e)\n"
    )], cwd=elsewhere, timeout=60, env=env)
    module, quick, error = probe.stdout.splitlines()
    assert Path(module) == site / "tfdist" / "__init__.py"
    assert Path(quick) == site / "tfdist" / "experiments" / "quick.yaml"
    assert f"one of: {', '.join(NAMES)}." in error

    model_dir = tmp_path / "run"
    _run(["-m", "tfdist.train", "--config", "quick", "--strategy", "one_device", f"--model_dir={model_dir}",
          "--noexport"], cwd=elsewhere, timeout=300, env=env)
    assert (model_dir / "summary.json").is_file()
    params = yaml.safe_load((model_dir / "params.yaml").read_text())
    quick_values = yaml.safe_load((EXPERIMENTS / "quick.yaml").read_text())
    for section, values in quick_values.items():
        for name, value in values.items():
            assert params[section][name] == value, f"{section}.{name}"

