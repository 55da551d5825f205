"""The link between node 0 and the ranks of the other nodes (``--nnodes``).

Node 0's executor listens on ``--master-addr:--master-port``; each rank of a ``--headless`` node
connects, says who it is, and once accepted its socket carries the same framed, pickled calls and
replies as a local worker's socket pair. torch.distributed's rendezvous is on the next port.

Trust, as vLLM's: both ports are for the group alone. The hello is JSON read with a size and a
time limit and checked against node 0's own layout (protocol, parallel sizes, node and rank, the
model's architecture, dtype and context), so a stray or misconfigured connection is refused and
closed before any pickle is read from it. A peer that passes is trusted with pickles both ways:
keep the ports reachable only from the group's own pods (e.g. a NetworkPolicy).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from infernetes.runtime.config import ParallelConfig, RuntimeConfig

logger = logging.getLogger(__name__)

PROTOCOL = "infernetes-ranks/1"
HELLO_LIMIT_BYTES = 4096
HELLO_TIMEOUT_S = 10.0
# Node 0 waits this long for the other nodes' ranks, and they for node 0: pods start, pull images
# and read checkpoints at their own pace.
JOIN_TIMEOUT_S = 1800.0
RETRY_S = 1.0
NOTE_EVERY_S = 60.0  # how often a wait says it is still waiting
_FRAME = struct.Struct("!I")


class NodeLinkError(RuntimeError):
    """The ranks of the nodes could not be joined."""


def rendezvous_url(parallel: ParallelConfig) -> str:
    """torch.distributed's rendezvous across nodes: node 0's address, the port after the link's."""
    host = parallel.master_addr
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"tcp://{host}:{parallel.master_port + 1}"


def layout_of(config: RuntimeConfig) -> dict[str, Any]:
    """What every node must agree on for their ranks to run one model together."""
    parallel, info = config.parallel, config.model.info
    return {
        "protocol": PROTOCOL,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "pipeline_parallel_size": parallel.pipeline_parallel_size,
        "nnodes": parallel.nnodes,
        "architecture": info.architecture,
        "dtype": str(info.dtype),
        "max_model_len": info.max_model_len,
    }


@dataclass
class JoinedRank:
    rank: int
    node: int
    peer: str
    conn: Connection


def _send_json(sock: socket.socket, value: dict[str, Any]) -> None:
    data = json.dumps(value).encode()
    sock.sendall(_FRAME.pack(len(data)) + data)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed during the hello")
        data += chunk
    return data


def _recv_json(sock: socket.socket) -> dict[str, Any]:
    (size,) = _FRAME.unpack(_recv_exactly(sock, _FRAME.size))
    if size > HELLO_LIMIT_BYTES:
        raise ValueError(f"a hello of {size} bytes (at most {HELLO_LIMIT_BYTES})")
    value = json.loads(_recv_exactly(sock, size))
    if not isinstance(value, dict):
        raise ValueError("a hello that is not a JSON object")
    return value


def _keep_alive(sock: socket.socket) -> None:
    """A peer whose node vanished sends no FIN: TCP keepalive finds it within a minute."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def _listen(master_addr: str, port: int) -> socket.socket:
    """Loopback stays loopback; any other address is node 0's name in the cluster, which its
    own pod may not resolve yet when it starts, so every interface listens (IPv4 and IPv6)."""
    with contextlib.suppress(OSError, ValueError):
        resolved = str(socket.getaddrinfo(master_addr, None, type=socket.SOCK_STREAM)[0][4][0])
        address = ipaddress.ip_address(resolved)
        if address.is_loopback:
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            return socket.create_server((resolved, port), family=family)
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


class RankListener:
    """Node 0's side: bound at once (a busy port fails the start), then ``join`` takes the other
    nodes' ranks."""

    def __init__(self, config: RuntimeConfig, seed: int) -> None:
        parallel = config.parallel
        self.parallel = parallel
        self.layout = layout_of(config)
        self.seed = seed
        self.address = f"{parallel.master_addr}:{parallel.master_port}"
        try:
            self.sock = _listen(parallel.master_addr, parallel.master_port)
        except OSError as error:
            raise NodeLinkError(
                f"cannot listen for the other nodes' ranks on port {parallel.master_port} "
                f"(--master-port): {error.strerror or error}"
            ) from error
        self.sock.settimeout(RETRY_S)

    def join(self, alive: Callable[[], None], timeout: float = JOIN_TIMEOUT_S) -> list[JoinedRank]:
        """Every rank of nodes 1.. once each, by rank; ``alive()`` raises when a local rank died."""
        local = self.parallel.local_world_size
        waiting = set(range(local, self.parallel.world_size))
        joined: list[JoinedRank] = []
        deadline = time.monotonic() + timeout
        next_note = time.monotonic() + NOTE_EVERY_S
        logger.info(
            "Waiting for ranks %d..%d of nodes 1..%d on %s",
            local,
            self.parallel.world_size - 1,
            self.parallel.nnodes - 1,
            self.address,
        )
        try:
            while waiting:
                alive()
                if time.monotonic() > deadline:
                    raise NodeLinkError(
                        f"ranks {sorted(waiting)} did not connect to {self.address} within "
                        f"{timeout:.0f} s: start the other nodes with --headless, --nnodes "
                        f"{self.parallel.nnodes}, --master-addr and --master-port pointing here"
                    )
                if time.monotonic() > next_note:
                    logger.info("Still waiting for ranks %s on %s", sorted(waiting), self.address)
                    next_note += NOTE_EVERY_S
                try:
                    sock, peer = self.sock.accept()
                except TimeoutError:
                    continue
                rank = self._welcome(sock, f"{peer[0]}:{peer[1]}", waiting)
                if rank is not None:
                    waiting.discard(rank.rank)
                    joined.append(rank)
        except BaseException:
            for rank in joined:
                rank.conn.close()
            raise
        finally:
            self.sock.close()  # nobody else may join once the group is complete
        return sorted(joined, key=lambda r: r.rank)

    def _welcome(self, sock: socket.socket, peer: str, waiting: set[int]) -> JoinedRank | None:
        sock.settimeout(HELLO_TIMEOUT_S)
        try:
            hello = _recv_json(sock)
            problem = self._problem(hello, waiting)
            if problem is not None:
                logger.warning("Refused a connection from %s: %s", peer, problem)
                with contextlib.suppress(OSError):
                    _send_json(sock, {"error": problem})
                sock.close()
                return None
            _send_json(sock, {"seed": self.seed})
        except (OSError, ValueError) as error:  # junk, too long, too slow, or gone
            logger.warning("Closed a connection from %s that sent no valid hello: %s", peer, error)
            sock.close()
            return None
        sock.settimeout(None)
        _keep_alive(sock)
        rank, node = hello["rank"], hello["node_rank"]
        logger.info("Rank %d of node %d joined from %s", rank, node, peer)
        return JoinedRank(rank, node, peer, Connection(sock.detach()))

    def _problem(self, hello: dict[str, Any], waiting: set[int]) -> str | None:
        theirs = {key: hello.get(key) for key in self.layout}
        if theirs != self.layout:
            differ = {k: (v, self.layout[k]) for k, v in theirs.items() if v != self.layout[k]}
            return f"its layout differs from node 0's (theirs, ours): {differ}"
        rank, node = hello.get("rank"), hello.get("node_rank")
        local = self.parallel.local_world_size
        if not isinstance(rank, int) or not isinstance(node, int) or rank // local != node:
            return f"rank {rank!r} is not a rank of node {node!r}"
        if rank not in waiting:
            return f"rank {rank} is not awaited (node 0's own, or already joined)"
        return None


def connect_to_leader(
    config: RuntimeConfig, rank: int, timeout: float = JOIN_TIMEOUT_S
) -> tuple[socket.socket, int]:
    """A headless node's side: connect rank ``rank`` to node 0, retrying until it listens; the
    connected socket and node 0's seed."""
    parallel = config.parallel
    address = (parallel.master_addr, parallel.master_port)
    hello = {**layout_of(config), "rank": rank, "node_rank": parallel.node_rank}
    deadline = time.monotonic() + timeout
    next_note = 0.0  # at once, then once a minute
    while True:
        sock = None
        try:
            sock = socket.create_connection(address, timeout=HELLO_TIMEOUT_S)
            _send_json(sock, hello)
            reply = _recv_json(sock)
            break
        except (OSError, ValueError) as error:
            if sock is not None:
                sock.close()
            if time.monotonic() > deadline:
                raise NodeLinkError(
                    f"node 0 did not accept rank {rank} at {address[0]}:{address[1]} "
                    f"(--master-addr, --master-port) within {timeout:.0f} s: {error}"
                ) from error
            if time.monotonic() > next_note:
                logger.info(
                    "Waiting for node 0 at %s:%d (rank %d of node %d): %s",
                    *address,
                    rank,
                    parallel.node_rank,
                    error,
                )
                next_note = time.monotonic() + NOTE_EVERY_S
            time.sleep(RETRY_S)
    if "error" in reply:
        sock.close()
        raise NodeLinkError(f"node 0 refused rank {rank}: {reply['error']}")
    sock.settimeout(None)
    _keep_alive(sock)
    return sock, int(reply["seed"])
