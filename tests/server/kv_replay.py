"""A server's KV events read back from its replay socket (``--kv-events-config``'s
``replay_endpoint``), as the server tests check them."""

from __future__ import annotations

import msgspec
import zmq

DEADLINE_S = 60  # a ceiling for a loaded machine, never what is asserted


def replayed_events(port: int) -> list[list]:
    """Every batch the server kept, from sequence 0: its events as they went out (arrays, each
    led by its event's name)."""
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.connect(f"tcp://127.0.0.1:{port}")
    try:
        client.send_multipart((b"", (0).to_bytes(8, "big")))
        events: list[list] = []
        while True:
            assert client.poll(DEADLINE_S * 1000), "the replay socket did not answer"
            _, sequence, payload = client.recv_multipart()
            if int.from_bytes(sequence, "big", signed=True) == -1:
                return events
            _, batch_events, _ = msgspec.msgpack.decode(payload)
            events += batch_events
    finally:
        client.close(linger=0)
