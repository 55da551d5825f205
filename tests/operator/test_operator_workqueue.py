"""The keyed work queue: one worker per key, bursts coalesced, re-queued when added while busy."""

import asyncio

from infernetes.operator.workqueue import WorkQueue


def test_a_key_is_queued_once_and_again_after_a_change_while_busy() -> None:
    async def main() -> list[str]:
        queue = WorkQueue()
        handled = []
        for key in ("a", "b", "a"):
            queue.add(key)
        assert len(queue) == 2
        key = await queue.get()
        queue.add(key)  # changed while being handled: handled again, after this pass
        handled.append(key)
        assert len(queue) == 1
        queue.done(key)
        while len(queue):
            key = await queue.get()
            handled.append(key)
            queue.done(key)
        return handled

    assert asyncio.run(main()) == ["a", "b", "a"]


def test_delayed_adds_keep_the_earliest_and_can_be_forgotten() -> None:
    async def main() -> tuple[object, int]:
        queue = WorkQueue()
        queue.add("a", delay=60)
        queue.add("a", delay=0.01)
        queue.add("b", delay=0.01)
        queue.forget("b")
        key = await asyncio.wait_for(queue.get(), timeout=30)
        return key, len(queue)

    assert asyncio.run(main()) == ("a", 0)
