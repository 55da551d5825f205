"""KV connectors (``--kv-transfer-config``): what moves KV-cache blocks in and out of this engine,
in the shape of vLLM's ``KVConnectorBase_V1``. A scheduler side tells the scheduler which prompt
tokens arrive from elsewhere and whether a finished request's blocks are still being sent; a
worker side loads and saves each attention layer's cache around the forward. Offloading and
disaggregated prefill are implementations of the one interface (``base.py``)."""
