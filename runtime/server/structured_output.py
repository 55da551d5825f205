"""Structured output, API side: which backends the server takes. A request's constraint travels
to the engine core as asked (``SamplingParams.structured_outputs``), where it is compiled once and
a bad one is refused with the field named (``engine/structured_output.py`` says why there)."""

from __future__ import annotations

# --guided-decoding-backend values: ours is llguidance ("guidance"); "auto" means it too.
SUPPORTED_BACKENDS = ("auto", "guidance")


class GuideError(ValueError):
    """A structured-output setting the server cannot honour; the message names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_backend(name: str | None, param: str = "guided_decoding_backend") -> None:
    if name is None:
        return
    backend = name.split(":", 1)[0]
    if backend not in SUPPORTED_BACKENDS:
        raise GuideError(
            f"{param} {backend!r} is not supported yet; supported: {', '.join(SUPPORTED_BACKENDS)}",
            param,
        )
