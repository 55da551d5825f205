"""DeviceConfig: the accelerator to run on."""

from infernetes.schema.declare import Arg

G = "DeviceConfig"

ARGS = (
    Arg(
        "device",
        "str",
        "auto",
        G,
        "Device type; auto detects the platform (the flag is kept for old command lines).",
        choices=("auto", "cuda", "cpu", "hpu", "neuron", "tpu", "xpu", "openvino"),
    ),
)
