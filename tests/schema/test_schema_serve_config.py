"""``ServeConfig`` and ``build_config``: attribute access, views, replace, immutability, pickling."""

import json
import pickle

import pytest

from infernetes.schema.args import CURRENT_ARGS
from infernetes.schema.config import ConfigError, ServeConfig, build_config


def test_attributes_by_dest():
    config = build_config("org/model", max_num_seqs=8, block_size=16, enable_prefix_caching=True)
    assert (config.model, config.max_num_seqs, config.block_size, config.enable_prefix_caching) == (
        "org/model",
        8,
        16,
        True,
    )
    with pytest.raises(AttributeError):
        _ = config.no_such_argument


def test_strings_are_converted_like_the_command_line():
    config = build_config(
        "m", max_num_seqs="8", max_model_len="2k", enforce_eager="true", cuda_graph_sizes="8"
    )
    assert (config.max_num_seqs, config.max_model_len, config.enforce_eager) == (8, 2000, True)
    assert config.cuda_graph_sizes == [8]


def test_to_dict_is_flat_plain_json():
    config = build_config("m", hf_overrides={"a": [1, 2]}, served_model_name=["x"])
    data = config.to_dict()
    assert set(data) == {arg.dest for arg in CURRENT_ARGS}
    assert type(data["hf_overrides"]) is dict and type(data["hf_overrides"]["a"]) is list
    assert json.loads(json.dumps(data)) == data


def test_grouped():
    grouped = build_config("m", tensor_parallel_size=2).grouped()
    assert grouped["ParallelConfig"]["tensor_parallel_size"] == 2
    assert grouped["ModelConfig"]["model"] == "m"
    assert grouped["frontend"]["port"] == 8000
    assert sum(len(v) for v in grouped.values()) == len(CURRENT_ARGS)


def test_replace_validates_and_leaves_the_original():
    config = build_config("m", max_num_seqs=8)
    changed = config.replace(max_num_seqs=16, enforce_eager=True)
    assert (config.max_num_seqs, changed.max_num_seqs, changed.enforce_eager, changed.model) == (
        8,
        16,
        True,
        "m",
    )
    with pytest.raises(ConfigError, match="--max-num-seqs"):
        config.replace(max_num_seqs=0)


def test_non_defaults():
    assert build_config("m", port=9000).non_defaults() == {"model": "m", "port": 9000}


def test_immutable():
    config = build_config("m", served_model_name=["a"], hf_overrides={"a": 1})
    with pytest.raises(AttributeError):
        config.max_num_seqs = 1
    with pytest.raises(TypeError):
        config.served_model_name.append("b")
    with pytest.raises(TypeError):
        config.hf_overrides["b"] = 2
    with pytest.raises(TypeError):
        ServeConfig({})


def test_pickles_and_hashes():
    config = build_config("m", hf_overrides={"a": {"b": [1]}}, served_model_name=["a"])
    clone = pickle.loads(pickle.dumps(config))
    assert clone == config and hash(clone) == hash(config)
    with pytest.raises(TypeError):
        clone.hf_overrides["x"] = 1


def test_unknown_argument_suggests_a_name():
    with pytest.raises(ConfigError, match="did you mean 'max_num_seqs'"):
        build_config("m", max_num_seq=4)


def test_errors_name_the_argument_and_the_allowed_values():
    with pytest.raises(ConfigError) as exc:
        build_config("m", scheduling_policy="lifo")
    assert exc.value.dest == "scheduling_policy" and exc.value.flag == "--scheduling-policy"
    assert "fcfs, priority" in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_required_values_cannot_be_none():
    with pytest.raises(ConfigError, match="--port"):
        build_config("m", port=None)
