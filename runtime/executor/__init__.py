"""The executor: how the engine core reaches its workers (one per rank)."""
