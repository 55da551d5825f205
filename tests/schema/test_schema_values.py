"""Value converters: sizes, booleans, JSON and key=value forms, adapters."""

import pytest

from infernetes.schema.values import parse_bool, parse_json, parse_name_path, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2048", 2048),
        ("1k", 1000),
        ("1K", 1024),
        ("25.6k", 25600),
        ("1m", 10**6),
        ("2M", 2 * 2**20),
        ("4G", 4 * 2**30),
        ("1.5g", 1_500_000_000),
        (" 8k ", 8000),
        (512, 512),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["abc", "1.5K", "1.5", "k", "1kk", "", True])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_bools():
    assert parse_bool("True") is True and parse_bool("0") is False and parse_bool(True) is True
    with pytest.raises(ValueError):
        parse_bool("maybe")


def test_json_whole_and_key_value_forms():
    assert parse_json('{"image": 4, "video": 1}') == {"image": 4, "video": 1}
    assert parse_json("image=4") == {"image": 4}
    assert parse_json("image=16,video=2") == {"image": 16, "video": 2}
    assert parse_json('["a", "b"]') == ["a", "b"]
    for bad in ("{not json", "nothing", "=3"):
        with pytest.raises(ValueError):
            parse_json(bad)


def test_adapters():
    assert parse_name_path("sql=/adapters/sql") == {"name": "sql", "path": "/adapters/sql"}
    full = '{"name": "a", "path": "/p", "base_model_name": "m"}'
    assert parse_name_path(full) == {"name": "a", "path": "/p", "base_model_name": "m"}
    for bad in ("noequals", '{"name": "a"}', '{"name": "a", "path": "p", "x": 1}'):
        with pytest.raises(ValueError):
            parse_name_path(bad)
