"""The cluster of a Slurm job step (``--cluster slurm``), as TensorFlow's ``SlurmClusterResolver`` lays it out."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from typing import Mapping

from tfdist.cluster.address import is_digits, split_address
from tfdist.cluster.spec import MAX_TASKS, SINGLE_TASK_TYPES, SLURM, TASK_TYPES, parse_cluster_spec
from tfdist.cluster.task import Task
from tfdist.errors import UserError
from tfdist import _compat

#: The lowest port of a job's tasks on a node (job ids ending in 000): see ``job_port_base``.
PORT_BASE = 8888
#: Ports a job's tasks may take on one node: at most this many tasks of a step on a node.
PORTS_PER_JOB = 16
#: Job ids share port blocks modulo this: jobs whose ids differ by a multiple of it collide.
PORT_BLOCKS = 1000

#: Where each fact is read: the job step's variables (set by srun), else the job's.
STEP_VARIABLES = {
    "nodelist": "SLURM_STEP_NODELIST",
    "tasks_per_node": "SLURM_STEP_TASKS_PER_NODE",
    "num_tasks": "SLURM_STEP_NUM_TASKS",
    "num_nodes": "SLURM_STEP_NUM_NODES",
}
JOB_VARIABLES = {
    "nodelist": "SLURM_JOB_NODELIST",
    "tasks_per_node": "SLURM_TASKS_PER_NODE",
    "num_tasks": "SLURM_NTASKS",
    "num_nodes": "SLURM_JOB_NUM_NODES",
}

_EXPECTED_TASKS = "type=count pairs separated by commas, e.g. worker=2,ps=1 (types: chief, worker, ps, evaluator)"
_TASKS_PER_NODE_RE = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_SCONTROL_TIMEOUT_S = 60


def job_port_base(environ: Mapping[str, str]) -> int:
    """The port of the first task on each node for this job: ``PORT_BASE`` plus a block of the job id's own.

    Two jobs on one node (``select/cons_tres``) must not share a port: a
    fixed one failed the second with "Address already in use". Job ``j``
    takes ``PORT_BASE + (j % PORT_BLOCKS) * PORTS_PER_JOB`` and up (8888..24871
    in all, below the ephemeral ports); every task and step computes the same
    from ``SLURM_JOB_ID``. Without it, ``PORT_BASE``.
    """
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return PORT_BASE
    if not is_digits(job_id):
        raise UserError(
            f"Invalid Slurm variable SLURM_JOB_ID for --cluster={SLURM}. Received: SLURM_JOB_ID={job_id!r}. "
            f"Expected an integer."
        )
    return PORT_BASE + (int(job_id) % PORT_BLOCKS) * PORTS_PER_JOB


def parse_slurm_tasks(text: str) -> dict[str, int]:
    """Parse ``--slurm_tasks``: ``"worker=2,ps=1"`` -> ``{"worker": 2, "ps": 1}``; ``""`` -> ``{}``.

    Checked here (and by ``tfdist.config.check_runtime``, through
    ``cluster.sources.check_flags``) rather than when the
    resolver runs, so that a typo is one line at start-up on every task.

    Raises:
        UserError: an item is not ``type=count``, a type is unknown or given
            twice, a count is not a positive integer, there is more than one
            chief or evaluator, or there is no worker.
    """
    if not text:
        return {}
    tasks: dict[str, int] = {}
    for item in text.split(","):
        task_type, sep, count = item.strip().partition("=")
        task_type, count = task_type.strip(), count.strip()
        problem = None
        if not sep:
            problem = f"{item.strip()!r} is not type=count"
        elif task_type not in TASK_TYPES:
            problem = f"unknown task type {task_type!r}"
        elif task_type in tasks:
            problem = f"{task_type!r} is given twice"
        elif not is_digits(count) or int(count) < 1:
            problem = f"the count of {task_type!r} is {count!r}, not an integer >= 1"
        elif int(count) > MAX_TASKS:
            problem = f"the count of {task_type!r} is {count!r}, more than {MAX_TASKS} tasks"
        elif task_type in SINGLE_TASK_TYPES and int(count) > 1:
            problem = f"there can be only one {task_type}"
        if problem:
            raise UserError(
                f"Invalid value for `--slurm_tasks`: {problem}. "
                f"Received: slurm_tasks={text!r}. Expected {_EXPECTED_TASKS}."
            )
        tasks[task_type] = int(count)
    if "worker" not in tasks:
        raise UserError(
            f"Invalid value for `--slurm_tasks`: no worker. Received: slurm_tasks={text!r}. "
            f"Expected at least one worker, e.g. worker=2,ps=1."
        )
    return tasks


@dataclasses.dataclass(frozen=True)
class Allocation:
    """What the Slurm environment says about this job step and this task.

    Attributes:
        rank: ``SLURM_PROCID``.
        num_tasks: the step's tasks.
        hosts: the nodes, in Slurm's order.
        tasks_per_node: tasks on each of ``hosts``, in the same order.
        node: the node this task runs on (``SLURMD_NODENAME``), or None.
        local_id: this task's index on its node (``SLURM_LOCALID``), or None.
        variables: the names the facts were read from (``STEP_VARIABLES`` or
            ``JOB_VARIABLES``), for error messages.
    """

    rank: int
    num_tasks: int
    hosts: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    node: str | None
    local_id: int | None
    variables: Mapping[str, str]

    def tasks_by_host(self) -> dict[str, int]:
        """Host -> number of tasks on it, as the resolver's ``tasks_per_node`` takes it."""
        return dict(zip(self.hosts, self.tasks_per_node))

    def position(self) -> int:
        """This task's index in the resolver's address list (hosts sorted by name, then local index).

        Falls back to ``rank`` when the node or the local index is unknown.
        """
        if self.node is None or self.local_id is None:
            return self.rank
        return sum(n for host, n in sorted(self.tasks_by_host().items()) if host < self.node) + self.local_id


def _variable(environ: Mapping[str, str], name: str) -> str:
    """A Slurm variable that must be set; its absence means this is not a Slurm job step."""
    value = environ.get(name, "").strip()
    if not value:
        raise UserError(
            f"Missing Slurm variable {name} for --cluster={SLURM}. Received: {name}={environ.get(name)!r}. "
            f"Expected to run inside a Slurm job step (srun ..., e.g. from configs/slurm/train.sbatch)."
        )
    return value


def _integer(environ: Mapping[str, str], name: str, low: int) -> int:
    """A Slurm variable that must be an integer >= ``low``."""
    value = _variable(environ, name)
    if not is_digits(value) or int(value) < low:
        raise UserError(
            f"Invalid Slurm variable {name} for --cluster={SLURM}. "
            f"Received: {name}={value!r}. Expected an integer >= {low}."
        )
    return int(value)


def expand_tasks_per_node(text: str, name: str) -> list[int]:
    """Expand Slurm's tasks-per-node form, ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Args:
        text: the value of ``name``.
        name: the variable it came from, named in the error.

    Raises:
        UserError: ``text`` is not in that form.
    """
    counts: list[int] = []
    for part in text.split(","):
        match = _TASKS_PER_NODE_RE.fullmatch(part.strip())
        if match is None:
            raise UserError(
                f"Invalid Slurm variable {name} for --cluster={SLURM}. Received: {name}={text!r}. "
                f"Expected counts per node such as 2(x3),1."
            )
        repeats = int(match.group(2) or 1)
        if repeats + len(counts) > MAX_TASKS or int(match.group(1)) > MAX_TASKS:
            raise UserError(
                f"Invalid Slurm variable {name} for --cluster={SLURM}: more tasks or nodes than {MAX_TASKS}. "
                f"Received: {name}={text!r}. Expected counts per node such as 2(x3),1."
            )
        counts += [int(match.group(1))] * repeats
    return counts


def expand_nodelist(nodelist: str, environ: Mapping[str, str], name: str = "nodelist") -> list[str]:
    """The host names of a Slurm node list (``node[1-2],gpu7`` -> node1, node2, gpu7), in order.

    Uses ``scontrol show hostnames`` from ``environ``'s ``PATH``, Slurm's own
    expansion; where there is no ``scontrol``, the resolver's
    ``expand_hostlist`` (which imports TensorFlow).

    Args:
        nodelist: the compressed list.
        environ: the environment ``scontrol`` runs with.
        name: the variable ``nodelist`` came from, named in errors.

    Raises:
        UserError: the list cannot be expanded, or is empty.
    """
    received = f"Received: {name}={nodelist!r}"
    scontrol = shutil.which("scontrol", path=environ.get("PATH", os.defpath))
    if scontrol:
        try:
            proc = subprocess.run(
                [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                timeout=_SCONTROL_TIMEOUT_S, env=dict(environ),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise UserError(f"Cannot run {scontrol} show hostnames: {e}. {received}. "
                            "Expected a working scontrol.") from None
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise UserError(f"scontrol show hostnames failed: {why}. {received}. Expected a Slurm node list.")
        hosts = proc.stdout.split()
    else:
        try:
            hosts = _compat.expand_slurm_hostlist(nodelist)
        except ValueError as e:
            raise UserError(f"Invalid Slurm node list: {e}. {received}. "
                            "Expected a node list such as node[1-2],gpu7.") from None
    if not hosts:
        raise UserError(f"Empty Slurm node list. {received}. Expected at least one node.")
    return hosts


def read_allocation(environ: Mapping[str, str] | None = None) -> Allocation:
    """Read and check the job step (or, outside ``srun``, the job) from ``SLURM_*`` variables.

    Args:
        environ: the environment; ``os.environ`` when None.

    Raises:
        UserError: a variable is missing or malformed, the node list, tasks per
            node, task count and node count disagree, the rank is out of
            range, or this task's node or local index is not in the list.
    """
    environ = os.environ if environ is None else environ
    names = STEP_VARIABLES if environ.get(STEP_VARIABLES["nodelist"], "").strip() else JOB_VARIABLES
    rank = _integer(environ, "SLURM_PROCID", 0)
    num_tasks = _integer(environ, names["num_tasks"], 1)
    nodelist = _variable(environ, names["nodelist"])
    per_node_text = _variable(environ, names["tasks_per_node"])
    per_node = expand_tasks_per_node(per_node_text, names["tasks_per_node"])
    hosts = expand_nodelist(nodelist, environ, names["nodelist"])
    received = f"{names['nodelist']}={nodelist!r} ({len(hosts)} nodes), {names['tasks_per_node']}={per_node_text!r}"
    if len(set(hosts)) != len(hosts):
        raise UserError("Invalid Slurm allocation: a node is listed twice. "
                        f"Received: {received}. Expected each node once.")
    if len(per_node) != len(hosts) or sum(per_node) != num_tasks or 0 in per_node:
        raise UserError(
            f"Inconsistent Slurm allocation. Received: {received}, {names['num_tasks']}={num_tasks}. "
            f"Expected one task count >= 1 per node, adding up to {names['num_tasks']}."
        )
    num_nodes = environ.get(names["num_nodes"], "").strip()
    if num_nodes and num_nodes != str(len(hosts)):
        raise UserError(
            f"Inconsistent Slurm allocation. Received: {received}, {names['num_nodes']}={num_nodes!r}. "
            f"Expected {names['num_nodes']} to be the number of nodes in {names['nodelist']}."
        )
    if rank >= num_tasks:
        raise UserError(
            f"Invalid Slurm variable SLURM_PROCID for --cluster={SLURM}. Received: SLURM_PROCID={rank}, "
            f"{names['num_tasks']}={num_tasks}. Expected a rank in 0..{num_tasks - 1}."
        )
    node = environ.get("SLURMD_NODENAME", "").strip() or None
    local_id = _integer(environ, "SLURM_LOCALID", 0) if environ.get("SLURM_LOCALID", "").strip() else None
    if node is not None and local_id is not None:
        on_node = dict(zip(hosts, per_node)).get(node)
        if on_node is None or local_id >= on_node:
            raise UserError(
                f"Invalid Slurm task: it runs on SLURMD_NODENAME={node!r} with SLURM_LOCALID={local_id}. "
                f"Received: {received}. Expected a node of the list with more than SLURM_LOCALID tasks."
            )
    return Allocation(
        rank=rank, num_tasks=num_tasks, hosts=tuple(hosts), tasks_per_node=tuple(per_node),
        node=node, local_id=local_id, variables=names,
    )


def layout(
    allocation: Allocation, jobs: Mapping[str, int], port_base: int
) -> tuple[dict[str, list[str]], str, int]:
    """The cluster and this task's (type, index), as ``SlurmClusterResolver`` gives them, without TensorFlow.

    The resolver lists ``host:port`` for the hosts sorted by name, a host's
    tasks at ``port_base``, ``port_base + 1``, ...; deals that list out to the
    task types in alphabetical order; and gives this task the entry at its
    position (``Allocation.position``, tfdist's placement).

    Raises:
        UserError: the counts of ``jobs`` do not add up to the step's tasks.
    """
    if sum(jobs.values()) != allocation.num_tasks:
        raise UserError(
            f"Invalid task counts for --cluster={SLURM}: they add up to {sum(jobs.values())}. "
            f"Received: {dict(jobs)}. Expected counts that add up to the step's {allocation.num_tasks} tasks."
        )
    addresses = [f"{host}:{port_base + i}" for host, n in sorted(allocation.tasks_by_host().items()) for i in range(n)]
    position = allocation.position()
    cluster: dict[str, list[str]] = {}
    start = 0
    own = ("", 0)
    for task_type, count in sorted(jobs.items()):
        cluster[task_type] = addresses[start:start + count]
        if start <= position < start + count:
            own = (task_type, position - start)
        start += count
    return cluster, own[0], own[1]


def resolve(
    slurm_tasks: str = "", environ: Mapping[str, str] | None = None, *, port_base: int | None = None
) -> Task:
    """The cluster of this Slurm job step and this process's task in it.

    Args:
        slurm_tasks: ``--slurm_tasks`` (see ``parse_slurm_tasks``); empty:
            every task of the step is a worker.
        environ: the environment to read ``SLURM_*`` (and ``PATH`` for
            ``scontrol``) from; ``os.environ`` when None. Nothing is written to it.
        port_base: the port of the first task on each node; None: the job's
            own (``job_port_base``).

    Returns:
        This process's ``Task``, as ``cluster.sources.resolve_task`` returns
        it; its ``spec.source`` is ``"slurm"``.

    Raises:
        UserError: ``slurm_tasks`` is malformed or does not add up to the
            step's tasks, or the environment is not a Slurm job step (see
            ``read_allocation``).
        RuntimeError: this task was placed away from its own node (a bug in
            ``layout``).
    """
    environ = os.environ if environ is None else environ
    allocation = read_allocation(environ)
    if port_base is None:
        port_base = job_port_base(environ)
        if max(allocation.tasks_per_node) > PORTS_PER_JOB:
            raise UserError(
                f"Too many tasks on one node for --cluster={SLURM}: {max(allocation.tasks_per_node)}. "
                f"Received: {allocation.variables['tasks_per_node']}={','.join(map(str, allocation.tasks_per_node))}. "
                f"Expected at most {PORTS_PER_JOB} tasks of a step per node "
                f"(each job has {PORTS_PER_JOB} ports a node)."
            )
    jobs = parse_slurm_tasks(slurm_tasks) or {"worker": allocation.num_tasks}
    if sum(jobs.values()) != allocation.num_tasks:
        raise UserError(
            f"Invalid value for `--slurm_tasks`: {sum(jobs.values())} tasks for a Slurm step of "
            f"{allocation.num_tasks}. Received: slurm_tasks={slurm_tasks!r}, "
            f"{allocation.variables['num_tasks']}={allocation.num_tasks}. "
            f"Expected counts that add up to the step's tasks (srun/sbatch --ntasks)."
        )
    addresses, task_type, index = layout(allocation, jobs, port_base)
    spec = parse_cluster_spec(addresses, source=SLURM)
    host, port = split_address(spec.address(task_type, index))
    if allocation.node is not None and allocation.local_id is not None and (host, port) != (
        allocation.node, port_base + allocation.local_id
    ):
        raise RuntimeError(
            f"tfdist.cluster.slurm placed task {task_type}:{index} at {host}:{port}, but it runs on "
            f"{allocation.node} as local task {allocation.local_id}."
        )
    return Task(spec=spec, type=task_type, index=index)
