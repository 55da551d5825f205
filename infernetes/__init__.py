"""infernetes: serve large language models on Kubernetes.

``LLM`` and ``SamplingParams`` are imported lazily so that ``infernetes --help`` and the operator
never pay for torch.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "infernetes.runtime.llm",
    "SamplingParams": "infernetes.runtime.sampling_params",
}

if TYPE_CHECKING:
    from infernetes.runtime.llm import LLM
    from infernetes.runtime.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'infernetes' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["LLM", "SamplingParams", "__version__"]
