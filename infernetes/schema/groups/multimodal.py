"""MultiModalConfig: limits and processor settings for image, video and audio inputs."""

from infernetes.schema.declare import Arg

G = "MultiModalConfig"

ARGS = (
    Arg(
        "limit-mm-per-prompt",
        "json",
        {},
        G,
        'Most items of each modality per prompt: JSON {"image": 16, "video": 2} or image=16,video=2.',
    ),
    Arg(
        "mm-processor-kwargs",
        "json",
        None,
        G,
        'Overrides for the multimodal processor, e.g. {"num_crops": 4}.',
    ),
    Arg(
        "disable-mm-preprocessor-cache",
        "bool",
        False,
        G,
        "Do not cache preprocessed multimodal inputs.",
    ),
)
