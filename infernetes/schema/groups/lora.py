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
    # Added in vLLM releases up to 0.33.
    Arg(
        "enable-tower-connector-lora",
        "bool",
        False,
        G,
        "Apply LoRA to the vision tower and connector too.",
    ),
    Arg("lora-target-modules", "str", None, G, "Modules adapters may apply to.", nargs="+"),
    Arg("default-mm-loras", "json", None, G, "Adapters applied by default per modality, as JSON."),
    Arg(
        "specialize-active-lora",
        "bool",
        False,
        G,
        "Specialize kernels on the number of active adapters.",
    ),
    Arg(
        "enable-mixed-moe-lora-format",
        "bool",
        False,
        G,
        "Accept MoE adapters mixing per-expert and shared formats.",
    ),
    Arg(
        "enable-moe-shared-loras",
        "bool",
        False,
        G,
        "Share one adapter across all experts of a MoE layer.",
    ),
    Arg("max-lora-cls-labels", "int", None, G, "Most labels of a classification adapter."),
)
