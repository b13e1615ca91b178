"""llm-d's sidecar seat: the workers a request's headers name, and the hosts a router may call.

In llm-d's sidecar seat the router runs beside vLLM in each decode pod, and llm-d's endpoint
picker names each request's prefill worker in ``x-prefiller-host-port`` and its encode workers
in ``x-encoder-hosts-ports`` (``docs/llm-d.md``, "The sidecar seat"). This module reads those
headers and checks their targets against an allow-list; it does no I/O and resolves no name.
The reference proxy uses it (``serve --prefill-from-header --allowed-worker-hosts LIST``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple, TypeAlias

from disagg_transforms.errors import ConfigError, RequestError, WorkerNotAllowedError

__all__ = ("ENCODE_HEADER", "PREFILL_HEADER", "WorkerHosts", "WorkerTarget", "worker_targets")

PREFILL_HEADER = "x-prefiller-host-port"
"""The header naming a request's prefill worker (``host:port``; a comma list: the first)."""
ENCODE_HEADER = "x-encoder-hosts-ports"
"""The header naming a request's encode workers (a comma list of ``host:port``)."""

_Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
# A DNS host name as Kubernetes writes them (RFC 1123 labels): no scheme, path, user or port.
_HOST_NAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?\Z"
)
_PORT = re.compile(r"[0-9]{1,5}\Z")
_MAX_PORT = 65535


class WorkerTarget(NamedTuple):
    """One ``host:port`` a header names: its host as written (IPv6 without brackets)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        """The worker's base URL: ``http://host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _address(host: str) -> _Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _target(entry: str, header: str) -> WorkerTarget:
    """``entry`` read as ``host:port``; a ``RequestError`` naming ``header`` otherwise."""
    host, colon, port = entry.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        valid = isinstance(_address(host), ipaddress.IPv6Address)
    else:
        # An IPv6 address outside brackets cannot be told from its port.
        named = _address(host) is not None or _HOST_NAME.match(host) is not None
        valid = ":" not in host and named
    if not (colon and valid and _PORT.match(port) and 0 < int(port) <= _MAX_PORT):
        msg = (
            f"{header}: expected host:port (no scheme, a port from 1 to 65535; an IPv6 "
            f"address in brackets), got {entry!r}"
        )
        raise RequestError(msg, param=header)
    return WorkerTarget(host, int(port))


def worker_targets(value: str | None, header: str) -> tuple[WorkerTarget, ...]:
    """Every worker a header's ``value`` names, in order; ``()`` when absent or blank.

    Spaces around each entry are ignored. Every entry is checked, used or not.

    Raises:
        RequestError: an entry is not ``host:port`` (``param`` is ``header``).
    """
    if value is None or not value.strip():
        return ()
    return tuple(_target(entry.strip(), header) for entry in value.split(","))


class WorkerHosts:
    """An allow-list of worker hosts: IP addresses, CIDRs and host names, comma-separated.

    A host name is matched as written, case-insensitively, and never resolved: a target written
    as an IP address matches only the addresses and networks, one written as a name only the
    names. Ports are not part of it (any port of an allowed host is allowed, as llm-d's SSRF
    protection allows).

    Raises:
        ConfigError: an entry is none of the three, or the list is empty (``param``
            ``allowed_worker_hosts``).
    """

    __slots__ = ("_names", "_networks", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        networks: list[_Network] = []
        names: set[str] = set()
        for raw in text.split(","):
            entry = raw.strip()
            if _HOST_NAME.match(entry) and _address(entry) is None and "/" not in entry:
                names.add(entry.lower().rstrip("."))
                continue
            try:
                networks.append(ipaddress.ip_network(entry))
            except ValueError as error:
                msg = (
                    f"allowed worker hosts: {entry!r} is not an IP address, a CIDR or a host "
                    f"name ({error})"
                )
                raise ConfigError(msg, param="allowed_worker_hosts") from None
        self._networks = tuple(networks)
        self._names = frozenset(names)

    def __repr__(self) -> str:
        return f"WorkerHosts({self.text!r})"

    def allows(self, host: str) -> bool:
        """Whether ``host`` (an IP address or a host name, as written) is on the list."""
        address = _address(host)
        if address is None:
            return host.lower().rstrip(".") in self._names
        return any(address in network for network in self._networks)

    def check(self, targets: tuple[WorkerTarget, ...], header: str) -> None:
        """Refuse the first of ``targets`` not on the list.

        Raises:
            WorkerNotAllowedError: naming the target and ``header``.
        """
        for target in targets:
            if not self.allows(target.host):
                msg = (
                    f"{header}: the worker {target.host}:{target.port} is not an allowed "
                    "worker host (--allowed-worker-hosts)"
                )
                raise WorkerNotAllowedError(msg, param=header)
