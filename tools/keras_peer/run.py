"""Keras' own tests of fit, callbacks and data adapters, run as they are, under TensorFlow's MirroredStrategy
and under tfdist's; and the outcomes of the modes compared.

A measurement, not part of tfdist's test suite (docs/fit.md, "Keras' own tests as a peer"):

    python tools/keras_peer/run.py extract KERAS_CHECKOUT TREE [--skip NAME ...]
    python tools/keras_peer/run.py run TREE MODE OUT.json [-k EXPR] [FILE ...]
    python tools/keras_peer/run.py compare OUT.json ...

``extract`` copies the test files of ``SUITES`` from a checkout of keras-team/keras (at the installed Keras' tag)
into ``TREE``, a folder per suite, with Keras' ``conftest.py`` and ``pyproject.toml`` (its pytest settings).
``run`` runs them in ``MODE``, one of ``peer_plugin.MODES``: each test file in a pytest process of its own (some
of Keras' tests reset TensorFlow's context, which would leave the next file without the strategy), with
KERAS_BACKEND=tensorflow; ``OUT.json`` maps each test's id to passed, failed, error or skipped. ``compare``
prints each mode's counts and every test whose outcome differs between the modes.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from peer_plugin import MODES  # noqa: E402

FILE_TIMEOUT_S = 1500
#: Keras' tests of fit, evaluate and predict, callbacks and data adapters: folder of TREE -> files of a checkout.
SUITES = {
    "trainers": ["keras/src/trainers/trainer_test.py", "keras/src/trainers/epoch_iterator_test.py"],
    "callbacks": ["keras/src/callbacks/*_test.py"],
    "data_adapters": ["keras/src/trainers/data_adapters/*_test.py"],
    "backend_tensorflow": ["keras/src/backend/tensorflow/distribute_test.py"],
}
VERBOSE_LINE = re.compile(r"^(\S+?\.py)::(\S+) (PASSED|FAILED|ERROR|SKIPPED)\b")


def extract(checkout: Path, tree: Path, skip: list[str]) -> None:
    """Copy ``SUITES`` (but the files named in ``skip``) and Keras' pytest set-up from ``checkout`` into ``tree``."""
    for name in ("conftest.py", "pyproject.toml"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(checkout / name, tree / name)
    for folder, patterns in SUITES.items():
        (tree / folder).mkdir(exist_ok=True)
        for path in sorted(p for pattern in patterns for p in checkout.glob(pattern)):
            if path.name not in skip:
                shutil.copy(path, tree / folder / path.name)
    print(f"{len(list(tree.rglob('*_test.py')))} test files in {tree}")


def outcomes(junit: Path, messages: dict[str, str] | None = None) -> dict[str, str]:
    """Each test case of a JUnit XML report as ``{file::class::name: outcome}``; a failure's or error's message
    (its exception's line) goes into ``messages`` under the same id."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name, outcome = f"{case.get('classname')}::{case.get('name')}", "passed"
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                if messages is not None and tag != "skipped":
                    messages[name] = (found.get("message") or "")[:300]
        result[name] = outcome
    return result


def streamed(output: str) -> dict[str, str]:
    """The outcomes that pytest's verbose lines name (``path/x_test.py::Class::name PASSED``), in the ids of
    ``outcomes``: what a file's run cut short by its timeout had reached."""
    result = {}
    for line in output.splitlines():
        match = VERBOSE_LINE.match(line)
        if match:
            path, rest, outcome = match.groups()
            cls, _, name = rest.rpartition("::")
            stem = Path(path).stem
            key = f"{stem}.{cls}::{name}" if cls else f"{stem}::{name}"
            if result.get(key) in (None, "passed"):  # an error at teardown follows the test's pass
                result[key] = outcome.lower()
    return result


def run(tree: Path, mode: str, out: Path, files: list[str], k: str | None, timeout: float = FILE_TIMEOUT_S) -> None:
    tree = tree.resolve()
    files = files or sorted(str(p.relative_to(tree)) for p in tree.rglob("*_test.py"))
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "KERAS_PEER_MODE": mode,
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    results, log, messages = {}, {}, {}
    for name in files:
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "junit.xml"
            cmd = [sys.executable, "-m", "pytest", "-c", str(tree / "pyproject.toml"), "--rootdir", str(tree),
                   "-p", "peer_plugin", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rfE",
                   f"--junitxml={junit}", *(["-k", k] if k else []), name]
            start = time.monotonic()
            try:
                proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
                status, tail = proc.returncode, proc.stdout[-4000:] + proc.stderr[-2000:]
            except subprocess.TimeoutExpired as e:
                output = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                status, tail = "timeout", output[-4000:]
            if junit.exists():
                found = outcomes(junit, messages)
            else:
                found = streamed(proc.stdout if status != "timeout" else output)
        results.update(found)
        counts = {o: list(found.values()).count(o) for o in ("passed", "failed", "error", "skipped")}
        log[name] = {"status": status, "seconds": round(time.monotonic() - start, 1), **counts, "tail": tail}
        print(f"{mode} {name}: status {status}, {log[name]['seconds']} s, {counts}", flush=True)
        # after each file, so that a run cut short keeps the files it finished
        out.write_text(json.dumps({"mode": mode, "tree": str(tree), "k": k, "files": log, "tests": results,
                                    "messages": messages}, indent=1))
    total = {o: list(results.values()).count(o) for o in ("passed", "failed", "error", "skipped")}
    print(f"{mode} total: {total}")


def compare(paths: list[Path]) -> None:
    """Among the tests that every mode ran (the outputs of one mode's runs merged, a later one winning): the counts
    per mode, then each test whose outcome differs between the modes."""
    runs: dict[str, dict[str, str]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        runs.setdefault(data["mode"], {}).update(data["tests"])
    common = set.intersection(*(set(tests) for tests in runs.values()))
    print(f"ran in every mode: {len(common)}")
    for mode, tests in runs.items():
        print(mode, {o: [tests[n] for n in common].count(o) for o in ("passed", "failed", "error", "skipped")})
    for name in sorted(common):
        seen = [tests[name] for tests in runs.values()]
        if len(set(seen)) > 1:
            print(" ".join(f"{mode}={outcome}" for mode, outcome in zip(runs, seen)), name)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("tree", type=Path)
    one.add_argument("mode", choices=MODES)
    one.add_argument("out", type=Path)
    one.add_argument("files", nargs="*", help="test files relative to TREE (default: every *_test.py)")
    one.add_argument("-k", default=None, help="pytest's -k, for every file")
    one.add_argument("--file-timeout", type=float, default=FILE_TIMEOUT_S, help="seconds for one file's pytest")
    ext = sub.add_parser("extract")
    ext.add_argument("checkout", type=Path)
    ext.add_argument("tree", type=Path)
    ext.add_argument("--skip", nargs="*", default=[], help="file names to leave out (tests of absent packages)")
    two = sub.add_parser("compare")
    two.add_argument("outs", type=Path, nargs="+")
    # files may follow -k too (argparse ends a positional list at an option)
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "run" or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "run":
        args.files += extra
        run(args.tree, args.mode, args.out, args.files, args.k, args.file_timeout)
    elif args.command == "extract":
        extract(args.checkout, args.tree, args.skip)
    else:
        compare(args.outs)


if __name__ == "__main__":
    main()
