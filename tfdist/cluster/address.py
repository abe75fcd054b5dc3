"""The grammar of one task address, ``host:port``: parse, check, split, compare."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from tfdist.errors import UserError, article, short

#: What an address looks like, for messages.
EXPECTED_ADDRESS = 'host:port, e.g. 10.0.0.2:2222, worker-0:2222 or "[::1]:2222"'

_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_DIGITS_RE = re.compile(r"[0-9]+")


def is_digits(text: str) -> bool:
    """Whether ``text`` is a non-empty string of ASCII digits (a port, an index written as text)."""
    return bool(_DIGITS_RE.fullmatch(text))


def _address_error(where: str, key: str, value: Any, problem: str) -> UserError:
    return UserError(
        f"Invalid address for `{key}` in {where}: {problem}. "
        f"Received: {short(value)}. Expected {EXPECTED_ADDRESS}."
    )


def parse_address(value: Any, *, key: str, where: str) -> tuple[str, int]:
    """Validate one ``host:port`` and return ``(host, port)``, the host without IPv6 brackets.

    Args:
        value: the address as received (any type: it may come from YAML).
        key: how the address is named in errors, e.g. ``worker[1]``.
        where: where it came from, for errors, e.g. ``cluster spec c.yaml``.

    Raises:
        UserError: not a string, whitespace, a URL scheme, no ``:port``, an
            empty or malformed host, an IPv6 host without brackets, or a port
            outside 1..65535.
    """
    if not isinstance(value, str):
        raise _address_error(where, key, value, f"{article(type(value).__name__)} is not a string")
    if any(c.isspace() for c in value):
        raise _address_error(where, key, value, "it contains whitespace")
    if "://" in value:
        raise _address_error(where, key, value, "a URL scheme is not part of an address")
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
        if not sep:
            raise _address_error(where, key, value, "a bracketed IPv6 host must be followed by :port")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _address_error(where, key, value, f"{host!r} is not an IPv6 address") from None
    else:
        if ":" not in value:
            raise _address_error(where, key, value, "no :port")
        host, _, port = value.rpartition(":")
        if ":" in host:
            raise _address_error(where, key, value, "an IPv6 host must be written in brackets, [host]:port")
        if not host:
            raise _address_error(where, key, value, "the host is empty")
        labels = host.removesuffix(".").split(".")
        if not _HOSTNAME_RE.fullmatch(host) or len(host) > 253 or not all(0 < len(label) <= 63 for label in labels):
            raise _address_error(
                where, key, value, f"{short(host, 40)} is not a host name (labels of 1 to 63 letters, digits, '-', "
                "'_', joined by '.', 253 characters at most) or an IP address"
            )
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise _address_error(where, key, value, f"{host!r} is not an IPv4 address") from None
    if not is_digits(port) or not 1 <= int(port) <= 65535:
        raise _address_error(where, key, value, f"the port {port!r} is not an integer in 1..65535")
    return host, int(port)


def split_address(address: str) -> tuple[str, int]:
    """Split a *valid* ``host:port`` into host (without IPv6 brackets) and port.

    Raises:
        UserError: ``address`` is not ``host:port``.
    """
    return parse_address(address, key="address", where="cluster spec <address>")


#: What every loopback address of a host is compared as (``address_identity``).
LOOPBACK = "localhost"


def address_identity(host: str, port: int) -> tuple[str, int]:
    """A comparable form of an address, so that ``[::1]`` and ``[0::1]`` (or ``Host.`` and ``host``) are the same.

    Every loopback address (``localhost``, a name under ``.localhost``, ``127.0.0.0/8``, ``::1``) is this host's
    one ``LOOPBACK``: TensorFlow's gRPC server binds its port on every interface, so two tasks of one host on one
    port collide whatever loopback address each names.
    """
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.lower().rstrip(".")
        return (LOOPBACK if name == LOOPBACK or name.endswith("." + LOOPBACK) else name), port
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return (LOOPBACK if ip.is_loopback else ip.compressed), port
