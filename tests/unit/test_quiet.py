"""The start-up line filter: which lines are noise, how the forwarder passes the rest on, the opt-out, one-line errors before TensorFlow."""

import os
import time

import psutil
import pytest

from helpers.clis import assert_user_error, run_cli, run_python
from tfdist import quiet


def noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if quiet.is_noise(line.encode())]


#: Lines TensorFlow 2.21 printed here when it started (CPU only, TF_CPP_MIN_LOG_LEVEL=2).
SEEN_HERE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796170213.882950   27408 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.",
    "E0000 00:00:1796170225.367140   27408 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)",
    "I0000 00:00:1733900000.000000    1234 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. To turn "
    "them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "E0000 00:00:1733900000.000000    1234 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to "
    "register factory for plugin cuDNN when one has already been registered",
    "I0000 00:00:1733900000.000000    1234 cpu_feature_guard.cc:210] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
]


#: Lines that must pass: real warnings and errors, and tfdist's own.
MUST_PASS = [
    "W0000 00:00:1733900000.000000    1234 grpc_server_lib.cc:99] Something real went wrong",
    "E0000 00:00:1733900000.000000    1234 collective_ops.cc:1] Collective ops is aborted by: peer lost",
    "F0000 00:00:1733900000.000000    1234 tensor.cc:1] Check failed: dims() == 2",
    "error: Invalid value for `--strategy`.",
    "W1202 00:11:59.426927 140263121995456 connectionpool.py:874] Retrying",
    "WARNING: something else before absl::InitializeLog()",
]


@pytest.mark.parametrize("line", SEEN_HERE)
def test_tensorflows_start_up_lines_are_noise(line):
    assert quiet.is_noise(line.encode())


@pytest.mark.parametrize("line", MUST_PASS)
def test_real_warnings_and_errors_are_not_noise(line):
    assert not quiet.is_noise(line.encode())


def test_filter_lines_keeps_the_unfinished_rest():
    data = (SEEN_HERE[0] + "\nkeep me\n" + SEEN_HERE[1] + "\npart").encode()
    assert quiet.filter_lines(data) == (b"keep me\n", b"part")


@pytest.mark.parametrize("env, out", [
    ({}, False), ({"TF_CPP_MIN_LOG_LEVEL": "2"}, False), ({"TFDIST_TF_LOGS": "1"}, True),
    ({"TF_CPP_MIN_LOG_LEVEL": "0"}, True), ({"TFDIST_TF_LOGS": "0"}, False),
])
def test_opt_out(env, out):
    assert quiet.opted_out(env) is out


def _installed(body: str, env=None, **popen):
    """Run ``body`` in a fresh Python after ``quiet.install()`` (no TensorFlow), bounded."""
    code = "import os, sys\nfrom tfdist import quiet\nassert quiet.install()\n" + body
    return run_python(code, timeout=60, env={"TF_CPP_MIN_LOG_LEVEL": None, **(env or {})}, text=False, **popen)


def test_descriptor_2_is_filtered_and_python_lines_bypass_it_even_with_os_exit():
    """C++ writes to fd 2 (noise dropped, the rest kept, in order before the error line); Python's line is never lost."""
    body = (
        f"os.write(2, {(SEEN_HERE[0] + chr(10) + MUST_PASS[0] + chr(10) + SEEN_HERE[2] + chr(10)).encode()!r})\n"
        "quiet.drain()\n"
        "sys.stderr.write('error: the one line\\n'); sys.stderr.flush()\n"
        "os._exit(2)\n"
    )
    proc = _installed(body)
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [MUST_PASS[0], "error: the one line"]


#: Writes the first part of a line to descriptor 2, waits until the forwarder has read it (nothing left in the
#: pipe), then writes the rest: the forwarder gets the line in two reads. Prints how long the line was unfinished
#: at most (from the last look that still saw bytes in the pipe to the end of the second write).
SPLIT_WRITE = r"""
import fcntl, struct, termios, time

def pending():
    return struct.unpack("i", fcntl.ioctl(2, termios.FIONREAD, b"\0\0\0\0"))[0]

def split_write(first, rest):
    since = time.monotonic()
    os.write(2, first)
    deadline = since + 10
    while pending():
        assert time.monotonic() < deadline, "the forwarder reads nothing"
        since = time.monotonic()
        time.sleep(0.001)
    os.write(2, rest)
    return time.monotonic() - since
"""


def test_a_line_that_comes_in_two_reads_is_kept_whole():
    """Halves of a real line are forwarded as one line; halves of a start-up line are dropped, none of them shown.

    The forwarder shows an unfinished line once nothing more comes for a while (``quiet._forwarder``): the
    start-up line is judged only where the line was unfinished for less than that (``gap``), which a loaded machine
    may exceed.
    """
    real, noise = MUST_PASS[0].encode(), SEEN_HERE[3].encode()
    body = SPLIT_WRITE + (
        f"real, noise = {real!r}, {noise!r}\n"
        "gaps = [split_write(real[:30], real[30:] + b'\\n'), split_write(noise[:60], noise[60:] + b'\\n')]\n"
        "quiet.drain()\n"
        "print(max(gaps), flush=True)\n"
        "sys.stderr.write('error: the one line\\n'); sys.stderr.flush()\n"
        "os._exit(2)\n"
    )
    proc = _installed(body)
    assert proc.returncode == 2, proc.stderr
    gap = float(proc.stdout.decode())
    lines = proc.stderr.decode().splitlines()
    assert lines[0] == MUST_PASS[0] and lines[-1] == "error: the one line", lines
    if gap < 0.15:
        assert lines == [MUST_PASS[0], "error: the one line"], (gap, lines)


def test_what_c_plus_plus_writes_right_before_abort_still_reaches_stderr():
    """A CHECK failure's line and then abort(): the forwarder is a process of its own, so the line survives."""
    proc = _installed(f"os.write(2, {(MUST_PASS[2] + chr(10)).encode()!r})\nos.abort()\n")
    assert proc.returncode == -6
    assert proc.stderr.decode().splitlines() == [MUST_PASS[2]]


def test_the_opt_out_installs_nothing():
    code = "import os\nfrom tfdist import quiet\nassert not quiet.install()\n" + \
        f"os.write(2, {(SEEN_HERE[0] + chr(10)).encode()!r})\n"
    proc = run_python(code, timeout=60, env={"TFDIST_TF_LOGS": "1"}, text=False)
    assert proc.returncode == 0 and proc.stderr.decode().splitlines() == [SEEN_HERE[0]]


def test_predict_with_a_bad_image_is_one_line(tmp_path):
    """tfdist.predict goes through the same run_main: its user error stays one line."""
    bad = tmp_path / "x.png"
    bad.write_text("not an image")
    result = run_cli("tfdist.predict", "--model_dir", str(tmp_path), "--image", str(bad), "--output",
                     str(tmp_path / "y.png"), timeout=60)
    assert_user_error(result)


def test_the_forwarder_is_no_child_of_the_cli_and_ends_with_it():
    """Whoever waits for a CLI's descendants sees only the run's own; the forwarder ends when its writers do."""
    proc = _installed("import psutil\nprint(len(psutil.Process().children(recursive=True)), os.getpgrp())\n",
                      start_new_session=True)
    children, group = proc.stdout.decode().split()
    assert proc.returncode == 0 and children == "0", proc.stderr
    deadline = time.monotonic() + 10
    while True:
        left = [p for p in psutil.process_iter() if _in_group(p, int(group))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, left


def _in_group(process, group: int) -> bool:
    try:
        return os.getpgid(process.pid) == group and process.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False

