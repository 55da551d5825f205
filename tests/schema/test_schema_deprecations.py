"""Deprecated flags stay accepted, warn, and map onto their replacements."""

import pytest

from infernetes.schema.config import build_config
from infernetes.schema.parser import parse_serve_args, parse_with_notices


@pytest.mark.parametrize(
    ("argv", "dest", "expected"),
    [
        (["--max-context-len-to-capture", "4096"], "max_seq_len_to_capture", 4096),
        (["--worker-use-ray"], "distributed_executor_backend", "ray"),
        (["--disable-mm-preprocessor-cache"], "mm_processor_cache_gb", 0.0),
        (
            ["--speculative-model", "org/draft", "--num-speculative-tokens", "5"],
            "speculative_config",
            {"model": "org/draft", "num_speculative_tokens": 5},
        ),
        (
            [
                "--speculative-model",
                "[ngram]",
                "--ngram-prompt-lookup-max",
                "4",
                "--ngram-prompt-lookup-min",
                "1",
            ],
            "speculative_config",
            {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 1},
        ),
        (
            ["-spec-draft-tp", "2", "--speculative-disable-mqa-scorer"],
            "speculative_config",
            {"draft_tensor_parallel_size": 2, "disable_mqa_scorer": True},
        ),
        (
            [
                "--spec-decoding-acceptance-method",
                "typical_acceptance_sampler",
                "--typical-acceptance-sampler-posterior-threshold",
                "0.09",
            ],
            "speculative_config",
            {"acceptance_method": "typical_acceptance_sampler", "posterior_threshold": 0.09},
        ),
        (
            ["--guided-decoding-backend", "xgrammar:no-fallback"],
            "guided_decoding_disable_fallback",
            True,
        ),
    ],
)
def test_deprecated_flags_map(argv, dest, expected):
    config, notices = parse_with_notices(["m", *argv])
    assert getattr(config, dest) == expected
    assert notices and all("deprecated" in n for n in notices)


@pytest.mark.parametrize(
    "argv",
    [
        ["--use-v2-block-manager"],
        ["--engine-use-ray"],
        ["--enable-reasoning"],
        ["--image-input-type", "pixel_values"],
        ["--image-token-id", "32000"],
        ["--tokenizer-pool-size", "8", "--tokenizer-pool-type", "ray"],
        ["--disable-image-processor"],
        ["--qlora-adapter-name-or-path", "x"],
        ["--mm-cache-preprocessor"],
        ["--quantization-param-path", "scales.json"],
    ],
)
def test_removed_flags_are_ignored_with_a_warning(argv):
    config, notices = parse_with_notices(["m", *argv])
    assert config == parse_serve_args(["m"])
    assert notices


def test_new_name_wins_over_old(capsys):
    config = parse_serve_args(
        ["m", "--max-seq-len-to-capture", "100", "--max-context-len-to-capture", "200"]
    )
    assert config.max_seq_len_to_capture == 100
    assert "WARNING: --max-context-len-to-capture is deprecated" in capsys.readouterr().err


def test_deprecated_values_are_still_checked(capsys):
    with pytest.raises(SystemExit):
        parse_serve_args(["m", "--num-speculative-tokens", "many"])
    assert "--num-speculative-tokens" in capsys.readouterr().err


def test_keyword_form_warns():
    with pytest.warns(FutureWarning, match="--worker-use-ray"):
        config = build_config("m", worker_use_ray=True)
    assert config.distributed_executor_backend == "ray"


def test_unknown_guided_decoding_option(capsys):
    with pytest.raises(SystemExit):
        parse_serve_args(["m", "--guided-decoding-backend", "xgrammar:fast"])
    assert "no-fallback" in capsys.readouterr().err
