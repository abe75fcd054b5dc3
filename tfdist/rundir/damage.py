"""Whether a run directory is whole: the files a run leaves each as the run writes it, so that damage (a file cut
short, garbled or edited, a checkpoint state naming files that are gone) is one line before a new run writes there.
"""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path
from typing import Any, Mapping

from tfdist.config import RETIRED
from tfdist.errors import UserError

#: The line of a checkpoint state file (``checkpoints/checkpoint``, a text ``CheckpointState``): ``key: value``.
_STATE_LINE = re.compile(r'\s*([a-z_]+)\s*:\s*(".*"|[-+0-9.eE]+)\s*')


def check_params_whole(old: Mapping[str, Any], params: Mapping[str, Mapping[str, Any]], run: Path) -> None:
    """Refuse a ``params.yaml`` that is not one a run writes: a run writes every setting of its config, each of
    its type, so a setting missing (a file cut short), unknown or of another type (a value cut, an edit) is
    damage: resumed over, the missing settings would be taken at their defaults.

    Raises:
        UserError: one line naming the first such setting and how many more there are.
    """
    if not old:
        return
    recorded = {section: old.get(section) or {} for section in params}
    missing = [f"{section}.{key}" for section, keys in params.items() for key in keys
               if key not in recorded[section]]
    unknown = [section for section in old if section not in params] + [
        f"{section}.{key}" for section, keys in recorded.items() for key in keys
        if key not in params[section] and not (section == "runtime" and key in RETIRED)]
    mistyped = [f"{section}.{key}={recorded[section][key]!r}" for section, keys in params.items()
                for key, value in keys.items()
                if key in recorded[section] and not same_type(recorded[section][key], value)]
    for found, what in ((missing, "lacks the setting"), (unknown, "has an unknown setting"),
                        (mistyped, "holds a value of another type:")):
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise UserError(f"Invalid --model_dir {run}: its params.yaml {what} {found[0]}{more}, so it is "
                            "not the file a run writes (cut short or edited). Received: that params.yaml. "
                            "Expected the params.yaml the run wrote, with every setting: restore it, or remove "
                            "the run directory or use a new --model_dir.")


def same_type(old: Any, new: Any) -> bool:
    """Whether a recorded setting ``old`` has the type of the setting ``new`` (an int where a float is, as YAML
    writes ``1.0``)."""
    if isinstance(new, bool) or isinstance(old, bool):
        return isinstance(new, bool) and isinstance(old, bool)
    if isinstance(new, float):
        return isinstance(old, (int, float))
    return type(old) is type(new)


def kind(path: Path) -> str:
    """What is at ``path``, for a message: ``directory``, ``file``, ``special file`` or ``symbolic link that leads
    nowhere`` (to nothing, or in a loop)."""
    if not path.exists():
        return "symbolic link that leads nowhere"
    return "directory" if path.is_dir() else "file" if path.is_file() else "special file"


def check_rows(path: Path, name: str, run: Path) -> None:
    """Every line of ``path`` (``metrics.jsonl``) one JSON object, as the run appends them; a row's beginning
    without its newline, last, may be one the chief is appending now (a task that starts while the run goes on)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                row = json.loads(line)
            except ValueError:
                appending = line.startswith(b'{"step": ') and not line.endswith(b"\n")
                row = {} if appending else None
            if not isinstance(row, dict):
                raise UserError(f"Invalid {name} {run}: line {number} of its {path.name} is not a JSON object. "
                                f"Received: {line[:40]!r}. Expected one JSON object a line, as runs append them: "
                                f"repair or remove that line, or use a new {name}.")


def check_summary(path: Path, name: str, run: Path) -> None:
    """``summary.json``: one JSON object, as a run writes it whole at its end (a garbled one is damage)."""
    try:
        summary = json.loads(path.read_bytes())
    except ValueError:
        summary = None
    if not isinstance(summary, dict):
        raise UserError(f"Invalid {name} {run}: its {path.name} is not a JSON object. Received: "
                        f"{path.read_bytes()[:40]!r}. Expected the summary a run writes at its end: restore it, or "
                        f"remove it (the run's checkpoints stay), or use a new {name}.")


def read_state(path: Path) -> dict[str, list[str]] | None:
    """The fields of a text checkpoint state (each a list of its values), or None when it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _STATE_LINE.fullmatch(line)
        if match is None:
            return None
        value = match.group(2)
        if value.startswith('"'):  # a C-escaped string
            value = codecs.escape_decode(value[1:-1].encode("utf-8"))[0].decode("utf-8", "replace")
        fields.setdefault(match.group(1), []).append(value)
    return fields or None


def files_there(directory: Path, checkpoint: str) -> bool:
    """Whether checkpoint ``checkpoint`` (relative to ``directory``, or absolute) has its index and every data
    shard (``.data-00000-of-00002``...)."""
    prefix = directory / checkpoint
    if not Path(f"{prefix}.index").is_file():
        return False
    shards = list(prefix.parent.glob(f"{prefix.name}.data-*-of-*"))
    if not shards:
        return False
    count = int(shards[0].name.rsplit("-of-", 1)[1])
    return all(Path(f"{prefix}.data-{i:05d}-of-{count:05d}").is_file() for i in range(count))


def step_of(checkpoint: str) -> int:
    """N of ``ckpt-N`` (-1 for another name)."""
    tail = checkpoint.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
