"""Node 0's listener for the other nodes' ranks: a rank that says the right hello joins and gets
node 0's seed; junk, a silent peer, another layout, a rank of another node and a rank twice are
refused and closed while node 0 keeps waiting; once every rank joined nobody else may connect.
On CUDA each node's ranks take its devices 0..local-1."""

from __future__ import annotations

import socket
import struct
import threading
from multiprocessing.connection import Connection
from types import SimpleNamespace

import pytest
import torch
from infernetes.runtime.config import ParallelConfig
from infernetes.runtime.executor import node_link
from infernetes.runtime.executor.node_link import NodeLinkError, RankListener, connect_to_leader


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:  # closed with our bytes unread
        return True


def _config(port: int, node_rank: int = 0, dtype: torch.dtype = torch.float32) -> SimpleNamespace:
    parallel = ParallelConfig(
        tensor_parallel_size=3, distributed_executor_backend="mp", nnodes=3,
        node_rank=node_rank, master_port=port,
    )  # fmt: skip
    info = SimpleNamespace(architecture="LlamaForCausalLM", dtype=dtype, max_model_len=128)
    return SimpleNamespace(parallel=parallel, model=SimpleNamespace(info=info))


def test_ranks_join_with_the_right_hello_and_everything_else_is_refused(monkeypatch):
    monkeypatch.setattr(node_link, "HELLO_TIMEOUT_S", 0.5)
    port = _free_port()
    listener = RankListener(_config(port), seed=1234)
    outcomes: dict[str, object] = {}

    def other_nodes() -> None:
        with socket.create_connection(("127.0.0.1", port)) as junk:
            junk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # a length of ~1.2 GB
            outcomes["junk closed"] = _closed_by_peer(junk)
        with socket.create_connection(("127.0.0.1", port)) as silent:
            outcomes["silent closed"] = _closed_by_peer(silent)  # after the hello timeout
        for name, config, rank in (
            ("other dtype", _config(port, 1, torch.bfloat16), 1),
            ("other node's rank", _config(port, 1), 2),
        ):
            with pytest.raises(NodeLinkError) as refused:
                connect_to_leader(config, rank, timeout=5)  # type: ignore[arg-type]
            outcomes[name] = str(refused.value)
        first, seed = connect_to_leader(_config(port, 1), 1, timeout=5)  # type: ignore[arg-type]
        outcomes["seed"] = seed
        with pytest.raises(NodeLinkError) as twice:
            connect_to_leader(_config(port, 1), 1, timeout=5)  # type: ignore[arg-type]
        outcomes["twice"] = str(twice.value)
        last, _ = connect_to_leader(_config(port, 2), 2, timeout=5)  # type: ignore[arg-type]
        outcomes["sockets"] = (first, last)

    def run_other_nodes() -> None:
        try:
            other_nodes()
        except BaseException as error:
            outcomes["failed"] = error

    def alive() -> None:
        if "failed" in outcomes:
            raise AssertionError(outcomes["failed"])

    thread = threading.Thread(target=run_other_nodes)
    thread.start()
    joined = listener.join(alive=alive, timeout=60)
    thread.join()

    assert [(r.rank, r.node) for r in joined] == [(1, 1), (2, 2)]
    assert outcomes["junk closed"] and outcomes["silent closed"]
    assert "layout differs" in str(outcomes["other dtype"])
    assert "torch.bfloat16" in str(outcomes["other dtype"])
    assert "rank 2 is not a rank of node 1" in str(outcomes["other node's rank"])
    assert "rank 1 is not awaited" in str(outcomes["twice"])
    assert outcomes["seed"] == 1234
    # the joined sockets carry the executor's framing both ways
    first, _ = outcomes["sockets"]  # type: ignore[misc]
    follower = Connection(first.detach())
    joined[0].conn.send_bytes(b"call")
    assert follower.recv_bytes() == b"call"
    follower.send_bytes(b"reply")
    assert joined[0].conn.recv_bytes() == b"reply"
    # the group is complete: the port is closed
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_node_0_gives_up_on_missing_ranks_and_a_headless_node_on_a_missing_node_0():
    port = _free_port()
    listener = RankListener(_config(port), seed=1)
    with pytest.raises(NodeLinkError, match=r"ranks \[1, 2\] did not connect .* --headless"):
        listener.join(alive=lambda: None, timeout=0.5)
    with pytest.raises(NodeLinkError, match="--master-addr, --master-port"):
        connect_to_leader(_config(port, 1), 1, timeout=0.5)  # type: ignore[arg-type]


def test_a_busy_master_port_is_named():
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(NodeLinkError, match=f"port {port} \\(--master-port\\)"):
            RankListener(_config(port), seed=1)


def test_a_local_wait_stops_when_a_local_rank_dies():
    listener = RankListener(_config(_free_port()), seed=1)

    def dead() -> None:
        raise RuntimeError("worker rank 0 exited")

    with pytest.raises(RuntimeError, match="worker rank 0 exited"):
        listener.join(alive=dead, timeout=30)


def test_the_hello_frame_is_bounded():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack("!I", node_link.HELLO_LIMIT_BYTES + 1))
        with pytest.raises(ValueError, match="at most"):
            node_link._recv_json(b)


def test_each_node_gives_its_ranks_its_own_devices_from_0(tiny_llama, monkeypatch):
    import dataclasses

    from infernetes.runtime.engine.engine_config import resolve_config
    from infernetes.runtime.worker import worker

    from infernetes.schema.config import build_config

    config, _ = resolve_config(
        build_config(
            model=str(tiny_llama), tensor_parallel_size=4, nnodes=2, node_rank=1, headless=True
        )
    )
    cuda = dataclasses.replace(config.device, device=torch.device("cuda"))
    config = dataclasses.replace(config, device=cuda)
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert list(config.parallel.local_ranks) == [2, 3]
    devices = [worker._rank_device(config, rank).device.device for rank in (2, 3)]
    assert devices == chosen == [torch.device("cuda", 0), torch.device("cuda", 1)]
