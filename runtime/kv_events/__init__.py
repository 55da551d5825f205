"""KV-cache events (``--kv-events-config``), as vLLM publishes them: what the prefix cache gained
and lost (``events.py``, reported by the ``BlockManager``), the flag read into a
``KVEventsConfig`` (``config.py``) and the ZMQ publisher each engine core runs
(``publisher.py``), for KV-aware routers such as llm-d's precise prefix-cache scorer."""
