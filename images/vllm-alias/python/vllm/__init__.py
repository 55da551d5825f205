"""Not vLLM: a thin alias of infernetes's entry points, installed in infernetes's runtime image
only (see images/vllm-alias/). It holds nothing but `vllm.entrypoints.openai.api_server`."""
