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
)
