"""The repository's paths, the bounded runs of a Python process or a tfdist CLI, and the check of a user error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

#: The repository's root, and this folder (the scripts tests start as processes).
REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent

#: Variables that change what a tfdist CLI does, which a started process inherits only where a test sets them:
#: a cluster's TF_CONFIG and the opt-out that shows TensorFlow's start-up lines (``tfdist.quiet``).
NOT_INHERITED = ("TF_CONFIG", "TFDIST_TF_LOGS")


def child_env(env: dict[str, str | None] | None = None, *, inherit: bool = True) -> dict[str, str]:
    """A started process's environment: this one's less ``NOT_INHERITED``, TensorFlow's C++ logs at level 2,
    this venv's ``python`` first on PATH; then ``env``, where None removes a variable. ``inherit=False``: ``env`` alone."""
    base: dict[str, str | None] = {}
    if inherit:
        base = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
        base["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return {k: v for k, v in {**base, **(env or {})}.items() if v is not None}


def python_argv(code_or_args) -> list[str]:
    """argv of ``python -c CODE`` (a str) or ``python ARGS...`` (a list), with this interpreter."""
    return [sys.executable, *(["-c", code_or_args] if isinstance(code_or_args, str) else map(str, code_or_args))]


def cli_argv(module: str, *args) -> list[str]:
    """argv of ``python -m MODULE ARGS...``: a tfdist CLI as a user runs it (for a launcher or ``Processes``)."""
    return python_argv(["-m", module, *args])


def run_python(code_or_args, *, timeout: float = 240, env=None, inherit: bool = True, cwd=None, check: bool = False,
               text: bool = True, **popen) -> subprocess.CompletedProcess:
    """Run ``python -c CODE`` (a str) or ``python ARGS...`` (a list) in a fresh process, bounded, its output
    captured, in ``child_env(env, inherit=inherit)``, from the repository's root unless ``cwd``; ``check``: it must
    exit 0."""
    args = python_argv(code_or_args)
    proc = subprocess.run(args, capture_output=True, text=text, timeout=timeout, env=child_env(env, inherit=inherit),
                          cwd=cwd or REPO, **popen)
    if check:
        assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_cli(module: str, *args, **options) -> subprocess.CompletedProcess:
    """Run ``python -m MODULE ARGS...`` (``tfdist.train``, ``tfdist.tfconfig``...) with ``run_python``'s options."""
    return run_python(["-m", module, *args], **options)


def start_cli(module: str, *args, env=None, inherit: bool = True, cwd=None) -> subprocess.Popen:
    """Start ``python -m MODULE ARGS...`` as ``run_cli`` runs it, its output piped: for runs side by side, each
    ended with ``communicate(timeout=...)``."""
    return subprocess.Popen(cli_argv(module, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(env, inherit=inherit), cwd=cwd or REPO)


def assert_user_error(proc, match: str | None = None) -> str:
    """A user error as every tfdist CLI ends on bad input: exit 2, nothing on stdout, no traceback, one line on
    stderr that starts with ``error: `` (and has the regex ``match``). ``proc``: a finished process, or its
    ``(returncode, stdout, stderr)``. Returns the line."""
    returncode, stdout, stderr = (proc.returncode, proc.stdout, proc.stderr) if hasattr(proc, "returncode") else proc
    assert returncode == 2, (returncode, stdout[-2000:], stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
    assert stdout == "", stdout[-2000:]
    if match is not None:
        assert re.search(match, lines[0]), (match, lines[0])
    return lines[0]
