"""The repository's paths and the bounded runs of a Python process or CLI that tests of every tier use."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

#: The repository's root, and this folder (the scripts tests start as processes).
REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent


def run_python(code_or_args, *, timeout: float = 240, env=None, cwd=None) -> subprocess.CompletedProcess:
    """Run ``python -c CODE`` (a str) or ``python ARGS...`` (a list) in a fresh process, bounded."""
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or REPO
    )


def tfconfig(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m tfdist.tfconfig ARGS`` for real, from the repository's root (in ``env``, if given)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist.tfconfig", *args], cwd=REPO, capture_output=True, text=True, timeout=60,
        env=env,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def assert_user_error(returncode: int, stdout: str, stderr: str, match: str | None = None) -> str:
    """Exit 2, nothing on stdout, exactly one non-empty line on stderr, no traceback."""
    assert returncode == 2, (returncode, stderr)
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), stderr
    assert stdout == ""
    if match is not None:
        assert re.search(match, lines[0]), (match, lines[0])
    return lines[0]
