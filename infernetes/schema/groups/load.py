"""LoadConfig: how model weights are found and read."""

from infernetes.schema.choices import LOAD_FORMATS
from infernetes.schema.declare import Arg

G = "LoadConfig"

ARGS = (
    Arg(
        "load-format",
        "str",
        "auto",
        G,
        "Weights format: auto tries safetensors then PyTorch bin; dummy makes random weights.",
        choices=LOAD_FORMATS,
    ),
    Arg(
        "download-dir",
        "str",
        None,
        G,
        "Where weights are downloaded; the Hugging Face cache when unset.",
        operator_owned=True,
    ),
    Arg("model-loader-extra-config", "json", {}, G, "Extra settings handed to the chosen loader."),
    Arg(
        "ignore-patterns",
        "str",
        None,
        G,
        'File patterns to skip when loading (default "original/**/*").',
        nargs="+",
    ),
    Arg("use-tqdm-on-load", "bool", True, G, "Show a progress bar while loading weights."),
    Arg(
        "pt-load-map-location",
        "str",
        "cpu",
        G,
        'torch.load map_location for .bin/.pt checkpoints: a device, or JSON like {"cuda:1": "cuda:0"}.',
    ),
    # Added in vLLM releases up to 0.33.
    Arg(
        "safetensors-load-strategy",
        "str",
        None,
        G,
        "How safetensors files are read: lazy, eager, prefetch or torchao.",
        choices=("eager", "lazy", "prefetch", "torchao"),
    ),
    Arg(
        "safetensors-prefetch-num-threads",
        "int",
        8,
        G,
        "Threads that prefetch safetensors files.",
        minimum=1,
    ),
    Arg(
        "safetensors-prefetch-block-size",
        "size",
        16777216,
        G,
        "Block size of the safetensors prefetch, in bytes.",
    ),
    Arg(
        "offload-backend",
        "str",
        "auto",
        G,
        "How weights are offloaded to the CPU: uva, prefetch or auto.",
        choices=("auto", "prefetch", "uva"),
    ),
    Arg("cpu-offload-params", "str", [], G, "Parameter names offloaded to the CPU.", nargs="+"),
    Arg("offload-group-size", "int", 0, G, "Layers per weight-offload group."),
    Arg("offload-num-in-group", "int", 1, G, "Offloaded layers per group."),
    Arg("offload-prefetch-step", "int", 1, G, "Layers prefetched ahead under weight offloading."),
    Arg(
        "offload-params",
        "str",
        [],
        G,
        "Parameter names offloaded under prefetch offloading.",
        nargs="+",
    ),
)
