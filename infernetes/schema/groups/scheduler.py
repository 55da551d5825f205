"""SchedulerConfig: continuous batching, chunked prefill and the per-step token budget."""

from infernetes.schema.declare import Arg

G = "SchedulerConfig"

ARGS = (
    Arg("max-num-batched-tokens", "size", None, G,
        "Token budget of one engine step; chosen from the usage context when unset.", minimum=1),
    Arg("max-num-seqs", "int", None, G, "Most sequences in one engine step; chosen when unset.", minimum=1),
    Arg("max-num-partial-prefills", "int", 1, G, "Chunked prefill: most prompts partly prefilled at once.",
        minimum=1),
    Arg("max-long-partial-prefills", "int", 1, G,
        "Chunked prefill: most long prompts (see --long-prefill-token-threshold) prefilled at once.",
        minimum=1),
    Arg("long-prefill-token-threshold", "int", 0, G,
        "Chunked prefill: a prompt longer than this counts as long.", minimum=0),
    Arg("enable-chunked-prefill", "bool", None, G, "Split long prefills into chunks that share steps with decodes."),
    Arg("num-lookahead-slots", "int", 0, G, "Extra KV slots per sequence per step for speculative tokens.",
        minimum=0),
    Arg("scheduler-delay-factor", "float", 0.0, G,
        "Wait this factor times the previous prompt latency before scheduling the next prompt.", minimum=0),
    Arg("preemption-mode", "str", None, G, "Preempt by recomputing or by swapping to CPU.",
        choices=("recompute", "swap")),
    Arg("num-scheduler-steps", "int", 1, G, "Forward steps per scheduler call.", minimum=1),
    Arg("multi-step-stream-outputs", "bool", True, G, "With multi-step scheduling, stream after every step."),
    Arg("scheduling-policy", "str", "fcfs", G,
        "fcfs: in arrival order; priority: by request priority (lower first), then arrival.",
        choices=("fcfs", "priority")),
    Arg("scheduler-cls", "str", "vllm.core.scheduler.Scheduler", G, "Scheduler class import path."),
    Arg("cuda-graph-sizes", "int", [512], G,
        "CUDA graph batch sizes: one value N captures 1, 2, 4 and multiples of 8 up to N; several are used as given.",
        nargs="+"),
    Arg("disable-chunked-mm-input", "bool", False, G, "Never split one multimodal item across steps."),
    Arg("disable-hybrid-kv-cache-manager", "bool", False, G,
        "Give every attention layer the same KV-cache size, even sliding-window ones."),
)
