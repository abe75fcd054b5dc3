"""Cluster spec files -> a validated ``ClusterSpec`` -> TF_CONFIG for each task.

A cluster spec file names every task of a distributed run once, in the shape
of TF_CONFIG's ``"cluster"``: the task types (``chief``, ``worker``, ``ps``,
``evaluator``) as top-level keys, each a list of ``host:port`` (a single
string is allowed for one task)::

    chief: 10.0.0.1:2222          # optional for multi_worker_mirrored
    worker: [10.0.0.2:2222, 10.0.0.3:2222]
    ps: [10.0.0.4:2222]           # parameter_server only
    evaluator: 10.0.0.5:2222      # optional

The same file is handed to every host, and each host picks its own task with
``--task type:index``; ``tf_config`` turns that into the TF_CONFIG the host's
TensorFlow reads. Everything a user can get wrong here (the file, its
addresses, the task, the strategy's needs) is caught before TensorFlow starts
and reported as one ``UserError`` line, because a bad cluster otherwise shows
up as a hang or a gRPC error minutes later on another host.

Under Slurm there is no file: ``--cluster slurm`` takes the cluster and the
task from the job step (``tfdist.slurm``, called by ``resolve_task``).

This module does not import TensorFlow (only ``--cluster slurm`` does, in
``tfdist.slurm``): CLIs read the cluster before they set environment
variables and logical devices that TensorFlow reads once at start.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import shlex
import types
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from tfdist.errors import UserError

#: The task types of TF_CONFIG, in the order tfdist lists them everywhere.
TASK_TYPES = ("chief", "worker", "ps", "evaluator")

#: Task types that may have at most one task.
SINGLE_TASK_TYPES = ("chief", "evaluator")

#: Cluster spec file extensions and the format each one means.
YAML_SUFFIXES = (".yaml", ".yml")
JSON_SUFFIXES = (".json",)

#: The source name of a cluster read from the environment.
TF_CONFIG = "TF_CONFIG"

#: The ``--cluster`` value (and source name) of a cluster taken from a Slurm allocation (``tfdist.slurm``).
SLURM = "slurm"

_EXPECTED_ADDRESS = 'host:port, e.g. 10.0.0.2:2222, worker-0:2222 or "[::1]:2222"'
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_DIGITS_RE = re.compile(r"[0-9]+")
_TASK_RE = re.compile(r"([^:\s]+):(-?[0-9]+)")


def _short(value: Any, limit: int = 80) -> str:
    """``repr`` of a received value, cut so that an error stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _where(source: str) -> str:
    if source == TF_CONFIG:
        return 'TF_CONFIG "cluster"'
    return "the Slurm allocation" if source == SLURM else f"cluster spec {source}"


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A validated cluster: every task's address, by task type and index.

    Build one with ``parse_cluster_spec``, ``load_cluster_spec`` or
    ``from_environment``, which validate; the constructor only orders the
    types, makes the addresses tuples and refuses an unknown task type.

    Attributes:
        tasks: task type -> addresses, ordered chief, worker, ps, evaluator,
            holding only the types present. Read-only.
        source: where the cluster came from (a file name, or ``"TF_CONFIG"``),
            named in every error about it.
    """

    tasks: Mapping[str, tuple[str, ...]]
    source: str = "<cluster>"

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in TASK_TYPES]
        if unknown:
            raise UserError(
                f"Unknown task type in {_where(self.source)}. Received: {_short(unknown[0])}. "
                f"Expected one of: {', '.join(TASK_TYPES)}."
            )
        ordered = {t: tuple(self.tasks[t]) for t in TASK_TYPES if t in self.tasks}
        object.__setattr__(self, "tasks", types.MappingProxyType(ordered))

    def __hash__(self) -> int:
        return hash((tuple(self.tasks.items()), self.source))

    def as_dict(self) -> dict[str, list[str]]:
        """The cluster in TF_CONFIG's ``"cluster"`` form: type -> list of addresses."""
        return {t: list(addresses) for t, addresses in self.tasks.items()}

    def task_list(self) -> list[tuple[str, int]]:
        """Every task as ``(type, index)``, chief first, then workers, ps, evaluator."""
        return [(t, i) for t, addresses in self.tasks.items() for i in range(len(addresses))]

    @property
    def num_tasks(self) -> int:
        """How many tasks (processes) the cluster has, of every type."""
        return sum(len(addresses) for addresses in self.tasks.values())

    @property
    def task_types(self) -> tuple[str, ...]:
        """The task types present, in ``TASK_TYPES`` order."""
        return tuple(self.tasks)

    def count(self, task_type: str) -> int:
        """How many tasks of ``task_type`` there are (0 when the type is absent)."""
        return len(self.tasks.get(task_type, ()))

    def addresses(self) -> list[str]:
        """Every task's ``host:port``, in ``task_list`` order."""
        return [a for addresses in self.tasks.values() for a in addresses]

    def address(self, task_type: str, index: int) -> str:
        """The ``host:port`` of one task.

        Raises:
            UserError: the task is not in the cluster.
        """
        check_task(self, task_type, index)
        return self.tasks[task_type][index]

    def leader(self) -> tuple[str, int]:
        """The task that writes the run's outputs: chief 0 if present, else worker 0."""
        return ("chief", 0) if "chief" in self.tasks else ("worker", 0)

    def is_leader(self, task_type: str, index: int) -> bool:
        """Whether ``(task_type, index)`` is ``leader()``."""
        return (task_type, index) == self.leader()


# --------------------------------------------------------------------------- addresses


def split_address(address: str) -> tuple[str, int]:
    """Split a *valid* ``host:port`` into host (without IPv6 brackets) and port.

    Args:
        address: an address that ``parse_cluster_spec`` accepted.

    Raises:
        UserError: ``address`` is not ``host:port``.
    """
    return _parse_address(address, key="address", source="<address>")


def _address_error(source: str, key: str, value: Any, problem: str) -> UserError:
    return UserError(
        f"Invalid address for `{key}` in {_where(source)}: {problem}. "
        f"Received: {_short(value)}. Expected {_EXPECTED_ADDRESS}."
    )


def _parse_address(value: Any, *, key: str, source: str) -> tuple[str, int]:
    """Validate one ``host:port`` and return ``(host, port)``; see ``parse_cluster_spec``."""
    if not isinstance(value, str):
        raise _address_error(source, key, value, f"{_a(type(value).__name__)} is not a string")
    if any(c.isspace() for c in value):
        raise _address_error(source, key, value, "it contains whitespace")
    if "://" in value:
        raise _address_error(source, key, value, "a URL scheme is not part of an address")
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
        if not sep:
            raise _address_error(source, key, value, "a bracketed IPv6 host must be followed by :port")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _address_error(source, key, value, f"{host!r} is not an IPv6 address") from None
    else:
        if ":" not in value:
            raise _address_error(source, key, value, "no :port")
        host, _, port = value.rpartition(":")
        if ":" in host:
            raise _address_error(source, key, value, "an IPv6 host must be written in brackets, [host]:port")
        if not host:
            raise _address_error(source, key, value, "the host is empty")
        if not _HOSTNAME_RE.fullmatch(host):
            raise _address_error(
                source, key, value, f"{host!r} is not a host name (letters, digits, '-', '_', '.') or an IP address"
            )
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise _address_error(source, key, value, f"{host!r} is not an IPv4 address") from None
    if not _DIGITS_RE.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise _address_error(source, key, value, f"the port {port!r} is not an integer in 1..65535")
    return host, int(port)


def _address_identity(host: str, port: int) -> tuple[str, int]:
    """A comparable form of an address, so that ``[::1]`` and ``[0::1]`` are the same."""
    try:
        return ipaddress.ip_address(host).compressed, port
    except ValueError:
        return host.lower().rstrip("."), port


def _is_local_hostname(host: str) -> bool:
    host = host.lower().rstrip(".")
    return host == "localhost" or host.endswith(".localhost")


def public_addresses(spec: ClusterSpec, *, include_hostnames: bool = True) -> list[str]:
    """The addresses that may be reachable from outside this machine's private networks.

    TensorFlow's gRPC servers have no authentication, so a caller warns when a
    cluster listens on such an address. An IP literal counts as public when
    ``ipaddress`` calls it global: loopback, private (10/8, 172.16/12,
    192.168/16, fc00::/7), link-local, shared (100.64/10), unspecified and
    reserved ranges are not. A host name cannot be classified without a DNS
    lookup, which this function never does (it must be fast and work offline),
    so every name except ``localhost`` and ``*.localhost`` counts as possibly
    public unless ``include_hostnames`` is false.

    Args:
        spec: a validated cluster.
        include_hostnames: whether to return addresses given by host name
            (other than localhost) as well as public IP literals.

    Returns:
        The matching addresses as written in the spec, in ``task_list`` order.
    """
    found = []
    for address in spec.addresses():
        host, _ = split_address(address)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            if include_hostnames and not _is_local_hostname(host):
                found.append(address)
            continue
        if ip.is_global and not ip.is_multicast:
            found.append(address)
    return found


# --------------------------------------------------------------------------- specs


def parse_cluster_spec(obj: Any, *, source: str) -> ClusterSpec:
    """Validate an already-loaded cluster (from YAML, JSON or TF_CONFIG).

    Args:
        obj: a mapping of task type -> list of ``host:port`` (or one string).
        source: where ``obj`` came from, named in every error (a file name, or
            ``"TF_CONFIG"``).

    Returns:
        The validated ``ClusterSpec``, ordered chief, worker, ps, evaluator.

    Raises:
        UserError: ``obj`` is empty or not a mapping; a task type is unknown;
            a type's value is not a non-empty list of ``host:port`` strings; an
            address is malformed (no port, a port outside 1..65535, an empty
            host, whitespace, an IPv6 host without brackets); an address is
            used twice; there is more than one chief or evaluator; or there is
            no worker.
    """
    where = _where(source)
    if obj is None or (isinstance(obj, Mapping) and not obj):
        raise UserError(
            f"Empty {where}. Received: {_short(obj)}. "
            f"Expected task types ({', '.join(TASK_TYPES)}) as keys, each a list of host:port."
        )
    if not isinstance(obj, Mapping):
        raise UserError(
            f"Invalid {where}: {'its value' if source == TF_CONFIG else 'the top level'} is {_a(type(obj).__name__)}. Received: {_short(obj)}. "
            f"Expected a mapping of task type ({', '.join(TASK_TYPES)}) -> list of host:port."
        )
    tasks: dict[str, tuple[str, ...]] = {}
    seen: dict[tuple[str, int], str] = {}
    for task_type, value in obj.items():
        if task_type not in TASK_TYPES:
            raise UserError(
                f"Unknown task type in {where}. Received: {_short(task_type)}. Expected one of: {', '.join(TASK_TYPES)}."
            )
        if isinstance(value, str):
            entries: list[Any] = [value]
            keys = [task_type]
        elif isinstance(value, (list, tuple)):
            entries = list(value)
            keys = [f"{task_type}[{i}]" for i in range(len(entries))]
        elif value is None or isinstance(value, Mapping):
            entries, keys = [], []
            if value:
                raise UserError(
                    f"Invalid value for `{task_type}` in {where}: a mapping. Received: {task_type}={_short(value)}. "
                    f"Expected a list of host:port (or one host:port string)."
                )
        else:  # a number, a bool: one malformed address
            entries, keys = [value], [task_type]
        if not entries:
            raise UserError(
                f"Empty task list for `{task_type}` in {where}. Received: {task_type}={_short(value)}. "
                f"Expected at least one host:port, or no `{task_type}` key at all."
            )
        if task_type in SINGLE_TASK_TYPES and len(entries) > 1:
            raise UserError(
                f"Too many `{task_type}` tasks in {where}. Received: {len(entries)} ({_short(value)}). "
                f"Expected exactly one {task_type}."
            )
        for key, entry in zip(keys, entries):
            identity = _address_identity(*_parse_address(entry, key=key, source=source))
            if identity in seen:
                raise UserError(
                    f"Duplicate address in {where}. Received: {entry!r} for both `{seen[identity]}` and `{key}`. "
                    f"Expected every task to have its own host:port."
                )
            seen[identity] = key
        tasks[task_type] = tuple(entries)
    if "worker" not in tasks:
        raise UserError(
            f"No `worker` in {where}. Received task types: {', '.join(t for t in TASK_TYPES if t in tasks)}. "
            f"Expected at least one worker, e.g. worker: [10.0.0.2:2222]."
        )
    return ClusterSpec(tasks=tasks, source=source)


class _UniqueKeySafeLoader(yaml.SafeLoader):
    """A YAML safe loader that refuses a key written twice (PyYAML keeps the last)."""


def _construct_unique_mapping(loader: Any, node: Any, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    result: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=deep)
    return result


_UniqueKeySafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _json_unique_object(pairs: list[tuple[str, Any]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def load_cluster_spec(path: str | os.PathLike) -> ClusterSpec:
    """Read and validate a cluster spec file.

    The format comes from the extension alone (``.yaml``/``.yml``: YAML,
    ``.json``: JSON) and is never guessed from the content, so that a file
    means the same thing on every host. A key written twice is an error in
    both formats (plain YAML and JSON loaders keep the last silently).

    Args:
        path: the cluster spec file.

    Returns:
        The validated ``ClusterSpec``; its ``source`` is ``str(path)``.

    Raises:
        UserError: the extension is not one of the above; the file is
            missing, unreadable, not UTF-8, empty or not valid YAML/JSON; or
            its content fails ``parse_cluster_spec``.
    """
    source = str(path)
    suffix = Path(source).suffix.lower()
    if suffix not in YAML_SUFFIXES + JSON_SUFFIXES:
        raise UserError(
            f"Unknown cluster spec file type. Received: {source!r} (extension {suffix or 'none'!r}). "
            f"Expected a file ending in {', '.join(YAML_SUFFIXES + JSON_SUFFIXES)}."
        )
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(
            f"Cluster spec file not found. Received: {source!r}. Expected an existing YAML or JSON file."
        ) from None
    except IsADirectoryError:
        raise UserError(
            f"Cluster spec file is a directory. Received: {source!r}. Expected a YAML or JSON file."
        ) from None
    except UnicodeDecodeError as e:
        raise UserError(
            f"Cluster spec file {source} is not UTF-8 text ({e.reason} at byte {e.start}). "
            f"Expected a YAML or JSON file."
        ) from None
    except OSError as e:
        raise UserError(
            f"Cannot read cluster spec file {source}: {e.strerror or type(e).__name__}. "
            f"Expected a readable YAML or JSON file."
        ) from None
    if not text.strip():
        raise UserError(
            f"Empty cluster spec file {source}. Received: {text!r}. "
            f"Expected task types ({', '.join(TASK_TYPES)}) as keys, each a list of host:port."
        )
    if suffix in JSON_SUFFIXES:
        try:
            obj = json.loads(text, object_pairs_hook=_json_unique_object)
        except json.JSONDecodeError as e:
            raise UserError(
                f"Invalid JSON in cluster spec file {source}: {e.msg} at line {e.lineno}, column {e.colno}. "
                f"Expected a JSON object of task type -> list of host:port."
            ) from None
        except ValueError as e:  # a duplicate key
            raise UserError(
                f"Invalid JSON in cluster spec file {source}: {e}. Expected each task type once."
            ) from None
    else:
        try:
            obj = yaml.load(text, Loader=_UniqueKeySafeLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e)
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise UserError(
                f"Invalid YAML in cluster spec file {source}: {problem}{at}. "
                f'Expected a mapping of task type -> list of host:port (quote IPv6 addresses: "[::1]:2222").'
            ) from None
    return parse_cluster_spec(obj, source=source)


# --------------------------------------------------------------------------- tasks


def check_task(spec: ClusterSpec, task_type: str, index: int, *, what: str = "task") -> None:
    """Check that ``(task_type, index)`` names a task of ``spec``.

    Args:
        spec: the cluster.
        task_type: one of ``TASK_TYPES``.
        index: the task's index within its type.
        what: how the caller calls the task in errors (e.g. "`--task`").

    Raises:
        UserError: the type is unknown or absent from the cluster, or the
            index is not an integer in range.
    """
    received = f"task={f'{task_type}:{index}'!r}"
    where = _where(spec.source)
    if task_type not in TASK_TYPES:
        raise UserError(
            f"Invalid {what}: unknown task type. Received: {received}. "
            f"Expected one of: {', '.join(TASK_TYPES)}, as type:index."
        )
    if task_type not in spec.tasks:
        raise UserError(
            f"Invalid {what}: {where} has no `{task_type}` tasks. Received: {received}. "
            f"Expected one of: {', '.join(f'{t}:{i}' for t, i in spec.task_list())}."
        )
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < spec.count(task_type):
        n = spec.count(task_type)
        raise UserError(
            f"Invalid {what}: task index out of range, {where} has {n} `{task_type}` task{'s' if n > 1 else ''}. "
            f"Received: {received}. Expected an index in 0..{n - 1}."
        )


def parse_task(text: str, spec: ClusterSpec) -> tuple[str, int]:
    """Parse ``--task type:index`` and check it names a task of ``spec``.

    Args:
        text: e.g. ``"worker:1"``.
        spec: the cluster the task belongs to.

    Returns:
        ``(type, index)``.

    Raises:
        UserError: ``text`` is not ``type:index`` with a non-negative integer
            index, or the task is not in ``spec``.
    """
    match = _TASK_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None or match.group(2).startswith("-"):
        raise UserError(
            f"Invalid value for `--task`. Received: task={_short(text)}. "
            f"Expected type:index with a non-negative integer index, e.g. worker:0 "
            f"(tasks of {_where(spec.source)}: {', '.join(f'{t}:{i}' for t, i in spec.task_list())})."
        )
    task_type, index = match.group(1), int(match.group(2))
    check_task(spec, task_type, index, what="value for `--task`")
    return task_type, index


def tf_config(spec: ClusterSpec, task_type: str, index: int) -> dict[str, Any]:
    """The TF_CONFIG of one task: ``{"cluster": ..., "task": {"type": ..., "index": ...}}``.

    Args:
        spec: the cluster.
        task_type: the task's type.
        index: the task's index within its type.

    Raises:
        UserError: the task is not in ``spec``.
    """
    check_task(spec, task_type, index)
    return {"cluster": spec.as_dict(), "task": {"type": task_type, "index": index}}


def tf_config_json(spec: ClusterSpec, task_type: str, index: int) -> str:
    """``tf_config`` as compact JSON, the value to put in the TF_CONFIG variable.

    Raises:
        UserError: the task is not in ``spec``.
    """
    return json.dumps(tf_config(spec, task_type, index), separators=(",", ":"))


def from_environment(environ: Mapping[str, str] | None = None) -> tuple[ClusterSpec, str, int] | None:
    """Read and validate a TF_CONFIG that is already set (by a launcher, Kubernetes...).

    TensorFlow would accept a malformed TF_CONFIG and fail later, on another
    host; this checks it as strictly as a cluster spec file.

    Args:
        environ: the environment to read; ``os.environ`` when None.

    Returns:
        ``(spec, task_type, index)``, or None when TF_CONFIG is unset, blank
        or an empty JSON object (TensorFlow's "no cluster" too).

    Raises:
        UserError: TF_CONFIG is not JSON, not an object, lacks ``"cluster"``
            or ``"task"``, its cluster fails ``parse_cluster_spec``, or its
            task is not a task of that cluster. The index may be an integer or
            a string of digits, as TensorFlow's resolver allows.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG", "")
    if not raw.strip():
        return None
    expected = 'Expected a JSON object {"cluster": {...}, "task": {"type": ..., "index": ...}}.'
    try:
        obj = json.loads(raw, object_pairs_hook=_json_unique_object)
    except ValueError as e:
        problem = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise UserError(
            f"Invalid TF_CONFIG environment variable: not valid JSON ({problem}). "
            f"Received: TF_CONFIG={_short(raw)}. {expected}"
        ) from None
    if isinstance(obj, dict) and not obj:
        return None
    if not isinstance(obj, dict):
        raise UserError(
            f"Invalid TF_CONFIG environment variable: {_a(type(obj).__name__)}, not a JSON object. "
            f"Received: TF_CONFIG={_short(raw)}. {expected}"
        )
    for key in ("cluster", "task"):
        if key not in obj:
            raise UserError(
                f'Invalid TF_CONFIG environment variable: no "{key}" key. '
                f"Received: TF_CONFIG={_short(raw)}. {expected}"
            )
    spec = parse_cluster_spec(obj["cluster"], source=TF_CONFIG)
    task = obj["task"]
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise UserError(
            f'Invalid "task" in TF_CONFIG. Received: task={_short(task)}. '
            f'Expected {{"type": one of {", ".join(spec.tasks)}, "index": an integer}}.'
        )
    task_type, index = task["type"], task["index"]
    if isinstance(index, str) and _DIGITS_RE.fullmatch(index):
        index = int(index)
    if not isinstance(task_type, str) or isinstance(index, bool) or not isinstance(index, int):
        raise UserError(
            f'Invalid "task" in TF_CONFIG. Received: task={_short(task)}. '
            f'Expected {{"type": one of {", ".join(spec.tasks)}, "index": a non-negative integer}}.'
        )
    check_task(spec, task_type, index, what='"task" in TF_CONFIG')
    return spec, task_type, index


def resolve_task(
    cluster_file: str | None,
    task: str | None,
    environ: Mapping[str, str] | None = None,
    *,
    slurm_tasks: str = "",
) -> tuple[ClusterSpec, str, int] | None:
    """The cluster and this process's task: from ``--cluster/--task``, else TF_CONFIG, else None.

    Flags win over the environment, as everywhere in tfdist. ``--cluster
    slurm`` takes the cluster and the task from the Slurm job step instead of
    a file (``tfdist.slurm.resolve``, which imports TensorFlow); nothing else
    here does.

    Args:
        cluster_file: ``--cluster`` (empty or None when not given), or
            ``"slurm"``.
        task: ``--task`` (empty or None when not given; must be empty with
            ``--cluster slurm``).
        environ: the environment to read TF_CONFIG (or the ``SLURM_*``
            variables) from; ``os.environ`` when None.
        slurm_tasks: ``--slurm_tasks``, the task types of a Slurm step, e.g.
            ``"worker=2,ps=1"``; empty: every task a worker. Only with
            ``--cluster slurm``.

    Returns:
        ``(spec, task_type, index)``, or None when neither flags nor TF_CONFIG
        describe a cluster (a single-process run).

    Raises:
        UserError: only one of ``cluster_file`` and ``task`` is given, or
            either fails ``load_cluster_spec``/``parse_task``, or TF_CONFIG
            fails ``from_environment``; with ``--cluster slurm``: a ``--task``,
            or a step that ``tfdist.slurm.resolve`` refuses; without it: a
            ``--slurm_tasks``.
    """
    from tfdist import slurm

    slurm.check_flags(cluster_file, task, slurm_tasks)
    if cluster_file == SLURM:
        return slurm.resolve(slurm_tasks, environ)
    if cluster_file and not task:
        spec = load_cluster_spec(cluster_file)
        raise UserError(
            f"Missing `--task` for --cluster={cluster_file}. Received: task={task!r}. "
            f"Expected type:index, one of: {', '.join(f'{t}:{i}' for t, i in spec.task_list())}."
        )
    if task and not cluster_file:
        raise UserError(
            f"Missing `--cluster` for --task={task}. Received: cluster={cluster_file!r}. "
            f"Expected a cluster spec file (YAML or JSON)."
        )
    if cluster_file:
        spec = load_cluster_spec(cluster_file)
        task_type, index = parse_task(task, spec)
        return spec, task_type, index
    return from_environment(environ)


# --------------------------------------------------------------------------- strategies


def check_strategy(spec: ClusterSpec, strategy: str) -> None:
    """Check that the cluster has the tasks ``strategy`` needs, before any host starts.

    - ``multi_worker_mirrored``: at least one worker and no ``ps`` (a chief
      and an evaluator are optional).
    - ``parameter_server``: at least one ``ps``, at least one worker and a
      chief, which runs the ``ClusterCoordinator``.
    - ``one_device``, ``mirrored``, ``central_storage``: one machine, so a
      cluster of one task at most.

    Args:
        spec: the cluster.
        strategy: one of ``tfdist.config.STRATEGIES``.

    Raises:
        UserError: the strategy is unknown, or the cluster does not fit it.
    """
    from tfdist.config import STRATEGIES

    if strategy not in STRATEGIES:
        raise UserError(
            f"Invalid value for `--strategy`. Received: strategy={strategy!r}. Expected one of: {', '.join(STRATEGIES)}."
        )
    counts = ", ".join(f"{t}={spec.count(t)}" for t in TASK_TYPES)
    where = _where(spec.source)
    problem = expected = None
    if strategy == "multi_worker_mirrored":
        if spec.count("worker") < 1:
            problem, expected = "no worker", "at least one worker"
        elif spec.count("ps"):
            problem, expected = "ps tasks are for parameter_server", "no ps tasks (or --strategy=parameter_server)"
    elif strategy == "parameter_server":
        missing = [
            name
            for name, ok in (
                ("a ps task", spec.count("ps") >= 1),
                ("a worker", spec.count("worker") >= 1),
                ("a chief (the coordinator)", spec.count("chief") == 1),
            )
            if not ok
        ]
        if missing:
            problem = "missing " + " and ".join(missing)
            expected = "at least one ps, at least one worker and one chief (the coordinator)"
    elif spec.num_tasks > 1:
        problem = f"{strategy} runs on one machine"
        expected = "a cluster of one task, or --strategy=multi_worker_mirrored or parameter_server"
    if problem:
        raise UserError(
            f"Invalid cluster for strategy={strategy!r} in {where}: {problem}. Received: {counts}. Expected {expected}."
        )


# --------------------------------------------------------------------------- commands


def task_commands(
    spec: ClusterSpec,
    cluster_file: str,
    extra_args: Sequence[str] = (),
    *,
    python: str = "python",
    module: str = "tfdist.train",
) -> list[tuple[str, int, str]]:
    """The shell command that starts each task of the cluster on its host.

    Every host runs the same command but for ``--task``; the cluster file
    path is used as given, so it must be valid on every host (e.g. relative
    to a checkout at the same place).

    Args:
        spec: the cluster.
        cluster_file: the path passed as ``--cluster``.
        extra_args: arguments appended to every command (e.g. training flags).
        python: the interpreter to run on the hosts.
        module: the module run with ``python -m``.

    Returns:
        ``(task_type, index, command)`` for every task in ``task_list`` order;
        each command is one shell-quoted line.
    """
    commands = []
    for task_type, index in spec.task_list():
        argv = [python, "-m", module, "--cluster", cluster_file, "--task", f"{task_type}:{index}", *extra_args]
        commands.append((task_type, index, shlex.join(argv)))
    return commands
