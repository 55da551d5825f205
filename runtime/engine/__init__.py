"""The engine core: requests, KV blocks, scheduler, LLMEngine and AsyncEngine."""
