"""The tasks of a cluster meet as training would, and swap what they must agree on (``tfdist.doctor``)."""

from __future__ import annotations

import dataclasses
import json
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tfdist.cluster.address import split_address
from tfdist.doctor.agree import Observation, Report
from tfdist.cluster.network import listen
from tfdist.cluster.peers import check_port_free
from tfdist.cluster.task import Task, slug_of

#: The folder under ``--model_dir`` where each task writes its token.
TOKEN_DIR = ".tfdist-doctor"
#: Seconds rounds 2 and 3 may take (at most ``--connect_timeout``).
SETTLE_SECONDS = 15.0
#: Seconds between two rounds of asking the peers that have not answered yet.
POLL_SECONDS = 0.1
#: Seconds one question may take (connect, ask, read the answer).
ASK_TIMEOUT = 2.0
#: Round trips to the leader for the clock offset (the shortest one is kept).
CLOCK_SAMPLES = 3
#: The most bytes an answer may have.
MAX_ANSWER = 1 << 20


@dataclasses.dataclass
class Meeting:
    """What one task learnt at the meeting.

    Attributes:
        reports: task -> its report (this task's included).
        observations: task -> its observation (those that came).
        missing: task -> why it never gave its report.
        left: task -> why its observation never came (it left before the end).
        seconds: how long the meeting took, from listening to the end.
    """

    reports: dict[str, Report]
    observations: dict[str, Observation]
    missing: dict[str, str]
    left: dict[str, str]
    seconds: float


class _Server:
    """This task's side of the meeting: answers ``{"want": ..., "from": ...}`` with one JSON line."""

    def __init__(self, task: Task, report: Report):
        self.task = task
        self.report = report
        self.observation: Observation | None = None
        self.fetched: set[str] = set()  # the peers that have this task's observation
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socket = listen(task.address)
        self._socket.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="doctor-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(ASK_TIMEOUT)
            try:
                request = json.loads(_read_line(conn))
                want, asker = request["want"], str(request["from"])
            except (OSError, ValueError, TypeError, KeyError):
                return
            with self._lock:
                value: Any = {"report": self.report.to_json(),
                              "observation": self.observation and self.observation.to_json()}.get(want)
            answer = {"task": self.task.name, "time": time.time()}
            if want != "time":
                answer[want] = value
            try:
                conn.sendall(json.dumps(answer).encode() + b"\n")
            except OSError:
                return
            if want == "observation" and value is not None:
                with self._lock:
                    self.fetched.add(asker)

    def publish(self, observation: Observation) -> None:
        with self._lock:
            self.observation = observation

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        self._socket.close()


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk or len(data) > MAX_ANSWER:
            raise ValueError("no complete line")
        data += chunk
    return data


def ask(address: str, want: str, asker: str) -> tuple[dict[str, Any] | None, float, float, str]:
    """Ask the task at ``address`` for ``want``: (its answer or None, time sent, time received, why None)."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=ASK_TIMEOUT) as conn:
            sent = time.time()
            conn.sendall(json.dumps({"want": want, "from": asker}).encode() + b"\n")
            line = _read_line(conn)
            received = time.time()
    except (OSError, ValueError) as e:
        why = "connection refused" if isinstance(e, ConnectionRefusedError) else (
            "something answers, but not tfdist.doctor" if isinstance(e, ValueError) else
            getattr(e, "strerror", None) or type(e).__name__)
        return None, 0.0, 0.0, why
    try:
        answer = json.loads(line)
    except ValueError:
        return None, 0.0, 0.0, "something answers, but not tfdist.doctor"
    return (answer, sent, received, "") if isinstance(answer, dict) else (None, 0.0, 0.0, "not tfdist.doctor")


def _gather(task: Task, peers: dict[str, str], want: str, parse: Callable[[dict], Any],
            deadline: float) -> tuple[dict[str, Any], dict[str, str]]:
    """Ask every peer for ``want`` until each has given it or ``deadline``: (task -> parsed value, task -> why not)."""
    got: dict[str, Any] = {}
    why = {name: "no answer" for name in peers}
    while True:
        for name, address in peers.items():
            if name in got:
                continue
            answer, _, _, problem = ask(address, want, task.name)
            if answer is None:
                why[name] = problem
            elif answer.get("task") != name:
                why[name] = f"{address} answers as {answer.get('task')}: another cluster spec or --task"
            elif answer.get(want) is not None:
                try:
                    got[name] = parse(answer[want])
                except (TypeError, KeyError, AttributeError):
                    why[name] = f"its answer is not a tfdist.doctor {want}"
        if len(got) == len(peers) or time.monotonic() >= deadline:
            return got, {name: text for name, text in why.items() if name not in got}
        time.sleep(POLL_SECONDS)


def clock_offset(task: Task, leader_address: str) -> tuple[float | None, float]:
    """This task's clock minus the leader's (seconds) and the round trip it was measured with; None: no answer."""
    best: tuple[float | None, float] = (None, 0.0)
    for _ in range(CLOCK_SAMPLES):
        answer, sent, received, _ = ask(leader_address, "time", task.name)
        if answer is None or not isinstance(answer.get("time"), (int, float)):
            continue
        trip = received - sent
        if best[0] is None or trip < best[1]:
            best = ((sent + received) / 2 - answer["time"], trip)
    return best


def token_path(model_dir: str, name: str) -> Path:
    """Where task ``name`` (``type:index``) writes its token under ``model_dir``."""
    return Path(model_dir) / TOKEN_DIR / slug_of(name)


def _write_token(model_dir: str, name: str) -> tuple[str, str]:
    """Write a fresh token for ``name``: (the token, "") or ("", why it could not)."""
    token = secrets.token_hex(16)
    path = token_path(model_dir, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token, encoding="utf-8")
    except OSError as e:
        return "", e.strerror or type(e).__name__
    return token, ""


def _unseen(me: Report, reports: dict[str, Report]) -> tuple[str, ...]:
    """The peers whose token this task cannot read back, the same, from its own ``model_dir``."""
    unseen = []
    for name, report in reports.items():
        if name == me.task or not report.token:
            continue
        try:
            found = token_path(me.model_dir, name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            found = ""
        if found != report.token:
            unseen.append(name)
    return tuple(unseen)


def _in_order(task: Task, by_task: dict[str, Any]) -> dict[str, Any]:
    """``by_task`` in ``task_list`` order, the same on every task (so that every task prints the same lines)."""
    names = [f"{t}:{i}" for t, i in task.spec.task_list()]
    return {name: by_task[name] for name in names if name in by_task}


def meet(task: Task, report: Report, *, timeout: float) -> Meeting:
    """Meet every other task of ``task.spec`` (see the module docstring); bounded, whatever the peers do.

    Args:
        task: this task.
        report: what it says of itself; its token is written here when it has a ``model_dir``.
        timeout: seconds to wait for the peers to show up (``--connect_timeout``).

    Raises:
        UserError: this task's port is already in use.
    """
    check_port_free(task)
    started = time.monotonic()
    token, storage_error = _write_token(report.model_dir, task.name) if report.model_dir else ("", "")
    report = dataclasses.replace(report, token=token)
    peers = {f"{t}:{i}": task.spec.address(t, i) for t, i in task.spec.task_list() if (t, i) != (task.type, task.index)}
    leader = "{}:{}".format(*task.spec.leader())
    server = None
    try:
        server = _Server(task, report)
        got, missing = _gather(task, peers, "report", Report.from_json, started + timeout)
        reports = _in_order(task, {task.name: report, **got})
        if missing:
            return Meeting(reports, {}, missing, {}, time.monotonic() - started)
        offset, trip = (0.0, 0.0) if task.name == leader else clock_offset(task, peers[leader])
        unseen = _unseen(report, reports) if report.model_dir and not storage_error else ()
        mine = Observation(task=task.name, clock_offset=offset, round_trip=trip, unseen=unseen,
                           storage_error=storage_error)
        server.publish(mine)
        settle = time.monotonic() + min(timeout, SETTLE_SECONDS)
        got, left = _gather(task, peers, "observation", Observation.from_json, settle)
        observations = {task.name: mine, **got}
        while not server.fetched >= set(peers) - set(left) and time.monotonic() < settle:
            time.sleep(POLL_SECONDS)
        return Meeting(reports, _in_order(task, observations), {}, left, time.monotonic() - started)
    finally:
        if server is not None:
            server.close()
        if token:
            token_path(report.model_dir, task.name).unlink(missing_ok=True)
            try:
                token_path(report.model_dir, task.name).parent.rmdir()  # the last task out removes the folder
            except OSError:
                pass
