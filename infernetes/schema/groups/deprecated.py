"""Flags older releases had and newer ones renamed or removed.

They stay accepted so old command lines keep working: each prints a deprecation warning and either
moves its value to the replacement or, when nothing replaced it, is ignored.
"""

from infernetes.schema.declare import Arg

ARGS = (
    Arg("max-context-len-to-capture", "int", None, "ModelConfig", "Old name of --max-seq-len-to-capture.",
        deprecated="renamed to --max-seq-len-to-capture", replaced_by="max_seq_len_to_capture"),
    Arg("worker-use-ray", "bool", None, "ParallelConfig", "Old way to ask for Ray workers.",
        deprecated="use --distributed-executor-backend ray", replaced_by="distributed_executor_backend=ray"),
    Arg("engine-use-ray", "bool", None, "ParallelConfig", "Ran the engine in a Ray actor; removed.",
        deprecated="removed; the engine no longer runs as a Ray actor"),
    Arg("use-v2-block-manager", "bool", None, "CacheConfig", "Chose the v2 block manager, now the only one.",
        deprecated="has no effect: the v2 block manager is the only one"),
    Arg("enable-reasoning", "bool", None, "DecodingConfig", "Turned reasoning mode on.",
        deprecated="has no effect: --reasoning-parser turns reasoning mode on"),
    Arg("speculative-model", "str", None, "SpeculativeConfig", "Draft model for speculative decoding.",
        deprecated="use --speculative-config '{\"model\": ...}'", replaced_by="speculative_config.model"),
    Arg("num-speculative-tokens", "int", None, "SpeculativeConfig", "Tokens proposed per speculative step.",
        deprecated="use --speculative-config '{\"num_speculative_tokens\": ...}'",
        replaced_by="speculative_config.num_speculative_tokens"),
    Arg("ngram-prompt-lookup-max", "int", None, "SpeculativeConfig", "Largest n-gram for prompt-lookup drafting.",
        deprecated="use --speculative-config '{\"method\": \"ngram\", \"prompt_lookup_max\": ...}'",
        replaced_by="speculative_config.prompt_lookup_max"),
    Arg("ngram-prompt-lookup-min", "int", None, "SpeculativeConfig", "Smallest n-gram for prompt-lookup drafting.",
        deprecated="use --speculative-config '{\"method\": \"ngram\", \"prompt_lookup_min\": ...}'",
        replaced_by="speculative_config.prompt_lookup_min"),
)
