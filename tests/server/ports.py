"""Free loopback ports for test servers. Under pytest-xdist the workers start servers at the same
time, each picking ports by binding port 0 and letting it go; to keep two workers from picking the
same port before either server binds it, each worker takes only the pairs of ports (2k, 2k+1) with
k modulo the worker count equal to its own index."""

from __future__ import annotations

import os
import socket


def _worker() -> tuple[int, int]:
    """(this worker's index, the number of workers); (0, 1) outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw")), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def _ours(port: int) -> bool:
    index, count = _worker()
    return (port // 2) % count == index


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _any_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port() -> int:
    """A port free now, in this worker's share."""
    while not _ours(port := _any_free_port()):
        pass
    return port


def free_port_pair() -> int:
    """An even port ``p`` free now whose neighbour ``p + 1`` is free too (torch.distributed's
    rendezvous takes the one after the master port), both in this worker's share."""
    while True:
        port = free_port() & ~1
        if _bindable(port) and _bindable(port + 1):
            return port
