"""ParallelConfig: tensor, pipeline, data and expert parallelism and how workers run."""

from infernetes.schema.declare import Arg

G = "ParallelConfig"

ARGS = (
    Arg("distributed-executor-backend", "str", None, G,
        "How model workers run: mp (processes on one host), ray, uni (one process) or external_launcher.",
        choices=("ray", "mp", "uni", "external_launcher")),
    Arg("pipeline-parallel-size", "int", 1, G, "Number of pipeline stages.", aliases=("-pp",), minimum=1),
    Arg("tensor-parallel-size", "int", 1, G, "Number of GPUs each layer is split across.", aliases=("-tp",),
        minimum=1),
    Arg("data-parallel-size", "int", 1, G, "Number of data-parallel engine replicas.", aliases=("-dp",),
        minimum=1),
    Arg("data-parallel-size-local", "int", None, G, "Data-parallel replicas on this node.", aliases=("-dpl",),
        minimum=0, operator_owned=True),
    Arg("data-parallel-address", "str", None, G, "Address of the data-parallel head node.", aliases=("-dpa",),
        operator_owned=True),
    Arg("data-parallel-rpc-port", "int", None, G, "RPC port of the data-parallel head node.",
        aliases=("-dpp",), minimum=0, maximum=65535, operator_owned=True),
    Arg("data-parallel-backend", "str", "mp", G, "How data-parallel replicas run.", aliases=("-dpb",),
        choices=("mp", "ray")),
    Arg("enable-expert-parallel", "bool", False, G, "Use expert parallelism instead of tensor parallelism for MoE layers."),
    Arg("enable-eplb", "bool", False, G, "Balance the load of MoE experts across ranks."),
    Arg("enable-multimodal-encoder-data-parallel", "bool", False, G,
        "Run the vision encoder data-parallel instead of tensor-parallel."),
    Arg("max-parallel-loading-workers", "int", None, G,
        "Load the model in batches with at most this many workers, to bound host RAM.", minimum=1),
    Arg("ray-workers-use-nsight", "bool", False, G, "Profile Ray workers with Nsight."),
    Arg("disable-custom-all-reduce", "bool", False, G, "Use NCCL all-reduce instead of the custom kernel."),
    Arg("worker-cls", "str", "auto", G, "Worker class import path; auto picks one for the platform."),
    Arg("worker-extension-cls", "str", "", G, "Class mixed into the worker to add collective_rpc methods."),
)
