"""Cluster spec files: YAML or JSON, by extension, read strictly (a key written twice is an error)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from tfdist.cluster.spec import TASK_TYPES, ClusterSpec, parse_cluster_spec
from tfdist.errors import UserError, special_file

#: Cluster spec file extensions and the format each one means.
YAML_SUFFIXES = (".yaml", ".yml")
JSON_SUFFIXES = (".json",)


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


def json_unique_object(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads``' ``object_pairs_hook`` that refuses a key written twice (``ValueError``)."""
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
    special = special_file(source)
    if special:
        raise UserError(
            f"Cluster spec file {source} is {special}, not a regular file. Received: {source!r}. "
            "Expected a regular YAML or JSON file."
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
            obj = json.loads(text, object_pairs_hook=json_unique_object)
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
