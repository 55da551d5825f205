"""Structured output, API side: which backends the server takes. A request's constraint travels
to the engine core as asked (``SamplingParams.structured_outputs``), where it is compiled once and
a bad one is refused with the field named (``engine/structured_output.py`` says why there)."""

from __future__ import annotations

from infernetes.schema.rules import STRUCTURED_OUTPUT_BACKENDS


class GuideError(ValueError):
    """A structured-output setting the server cannot honour; the message names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_backend(
    name: str | None, param: str = "guided_decoding_backend", server_backend: str | None = None
) -> None:
    """``name`` is a backend the engine has; a request's (``server_backend`` given) must be the
    one the server runs: a backend is chosen per engine, as in vLLM V1."""
    if name is None:
        return
    backend = name.split(":", 1)[0]
    if backend not in STRUCTURED_OUTPUT_BACKENDS:
        raise GuideError(
            f"{param} {backend!r} is not supported yet; supported: "
            f"{', '.join(STRUCTURED_OUTPUT_BACKENDS)}",
            param,
        )
    if server_backend is not None and backend not in ("auto", server_backend):
        raise GuideError(
            f"{param} {backend!r}: the backend is chosen per server, which runs "
            f"{server_backend!r}; leave it out of the request or start the server with "
            f'--structured-outputs-config \'{{"backend": "{backend}"}}\'',
            param,
        )
