"""LoRAConfig: serving LoRA adapters on top of the base model."""

from infernetes.schema.declare import Arg

G = "LoRAConfig"

ARGS = (
    Arg("enable-lora", "bool", None, G, "Serve LoRA adapters."),
    Arg("enable-lora-bias", "bool", False, G, "Allow bias terms in LoRA adapters."),
    Arg("max-loras", "int", 1, G, "Most LoRA adapters in one batch.", minimum=1),
    Arg(
        "max-lora-rank",
        "int",
        16,
        G,
        "Largest LoRA rank accepted.",
        choices=(1, 8, 16, 32, 64, 128, 256, 320, 512),
    ),
    Arg(
        "lora-extra-vocab-size",
        "int",
        256,
        G,
        "Most extra vocabulary entries a LoRA adapter may add.",
        minimum=0,
    ),
    Arg(
        "lora-dtype",
        "str",
        "auto",
        G,
        "LoRA weights dtype; auto follows the model.",
        choices=("auto", "float16", "bfloat16", "float32"),
    ),
    Arg(
        "long-lora-scaling-factors",
        "float",
        None,
        G,
        "RoPE scaling factors of long-context LoRA adapters served side by side.",
        nargs="+",
    ),
    Arg(
        "max-cpu-loras",
        "int",
        None,
        G,
        "LoRA adapters kept in CPU memory; at least --max-loras.",
        minimum=1,
    ),
    Arg(
        "fully-sharded-loras",
        "bool",
        False,
        G,
        "Shard all of the LoRA computation across tensor-parallel ranks.",
    ),
)
