"""A processor written against vLLM itself, which this server does not ship."""

from vllm.v1.sample.logits_processor import LogitsProcessor  # noqa: F401
