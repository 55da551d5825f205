"""spec.lora -> the server's LoRA flags: ``--enable-lora``, one ``--lora-modules`` entry per
adapter (a hub id as is, which the runtime downloads into the model cache; ``cache://<path>`` as
the path under the cache volume's mount), ``--max-loras`` as many as the adapters (so one step
may mix them all, within engine.maxCpuLoras when that is set) and ``--max-lora-rank``.

Adapters are fixed for a pod's life: a changed list changes the pod template and rolls the pods
(loading them through the running servers' API instead is not done; see docs/lora.md)."""

from collections.abc import Mapping
from typing import Any


def adapter_path(source: str, cache_mount: str) -> str:
    if source.startswith("cache://"):
        return f"{cache_mount}/{source.removeprefix('cache://')}"
    return source


def lora_args(spec: Mapping[str, Any], cache_mount: str) -> list[str]:
    """The LoRA flags of spec.lora; ``cache_mount`` is where the model cache volume is."""
    lora = spec.get("lora")
    if not lora or not lora.get("adapters"):
        return []
    engine = spec.get("engine") or {}
    adapters = lora["adapters"]
    args = [] if engine.get("enableLora") else ["--enable-lora"]
    modules = [f"{a['name']}={adapter_path(a['source'], cache_mount)}" for a in adapters]
    args += ["--lora-modules", *modules]
    if engine.get("maxLoras") is None:
        slots = len(adapters)
        if engine.get("maxCpuLoras") is not None:
            slots = min(slots, int(engine["maxCpuLoras"]))
        args.append(f"--max-loras={slots}")
    if lora.get("maxRank") is not None:
        args.append(f"--max-lora-rank={lora['maxRank']}")
    return args
