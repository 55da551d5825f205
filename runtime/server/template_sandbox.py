"""Chat templates sent by requests (``--trust-request-chat-template``) render in a child process.

A template is a program: ``{{ 'x' * 10**10 }}`` asks for 10 GB, nested loops run for hours, and
Jinja's sandbox bounds neither. The child has a memory ceiling (RLIMIT_DATA) and each render a
deadline; past it the child is killed and the next render starts a new one. The server's own
template (the model's, or ``--chat-template``) is trusted and renders in the API process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import resource
import threading
from multiprocessing.connection import Connection
from typing import Any

RENDER_TIMEOUT_S = 5.0
# Heap the child may grow by, beyond what it holds once the tokenizer is loaded.
MEMORY_HEADROOM_BYTES = 1 << 30
MAX_RENDERED_CHARS = 16 * 1024 * 1024
STARTUP_TIMEOUT_S = 60.0


class TemplateRenderError(Exception):
    """The request's template failed, ran out of time or memory, or produced too much text."""


def _child_main(conn: Connection, tokenizer_blob: bytes) -> None:
    tokenizer = pickle.loads(tokenizer_blob)
    ceiling = _data_segment_bytes() + MEMORY_HEADROOM_BYTES
    resource.setrlimit(resource.RLIMIT_DATA, (ceiling, ceiling))
    conn.send(("ready", None))
    while True:
        try:
            conversation, kwargs = conn.recv()
        except EOFError:  # the server went away
            return
        try:
            text = tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
            if len(text) > MAX_RENDERED_CHARS:
                conn.send(
                    (
                        "error",
                        f"the chat template produced {len(text)} characters, more than "
                        f"the {MAX_RENDERED_CHARS} allowed",
                    )
                )
            else:
                conn.send(("ok", text))
        except MemoryError:
            conn.send(("error", "the chat template needed more memory than allowed"))
        except BaseException as exc:  # anything the template raised is the request's problem
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _data_segment_bytes() -> int:
    """What RLIMIT_DATA counts of this process now (VmData: heap and private mappings)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class TemplateSandbox:
    """One child process, one render at a time (the preparation threads queue on the lock)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer_blob = pickle.dumps(tokenizer)
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Connection | None = None

    def render(
        self, conversation: list[dict[str, Any]], timeout_s: float = RENDER_TIMEOUT_S, **kwargs: Any
    ) -> str:
        """The rendered prompt; raises TemplateRenderError. Blocks: call it off the event loop."""
        with self._lock:
            conn = self._started()
            conn.send((conversation, kwargs))
            if not conn.poll(timeout_s):
                self._stop()
                raise TemplateRenderError(
                    f"the chat template did not finish within {timeout_s:g} s"
                )
            try:
                status, value = conn.recv()
            except EOFError:  # killed, e.g. by the memory ceiling in C code
                self._stop()
                raise TemplateRenderError("the chat template crashed its sandbox process") from None
        if status != "ok":
            raise TemplateRenderError(value)
        return value

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _started(self) -> Connection:
        if self._conn is not None and self._process is not None and self._process.is_alive():
            return self._conn
        self._stop()
        context = multiprocessing.get_context("spawn")  # no copy of the server's threads or locks
        parent, child = context.Pipe()
        self._process = context.Process(
            target=_child_main,
            args=(child, self._tokenizer_blob),
            name="chat-template-sandbox",
            daemon=True,
        )
        self._process.start()
        child.close()
        self._conn = parent
        try:
            ready = parent.poll(STARTUP_TIMEOUT_S) and parent.recv()[0] == "ready"
        except EOFError:
            ready = False
        if not ready:
            self._stop()
            raise TemplateRenderError("the chat-template sandbox process did not start")
        return parent

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._process = None
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
