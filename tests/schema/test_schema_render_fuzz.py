"""Property tests: arbitrary values survive render -> parse unchanged."""

from hypothesis import given, settings
from hypothesis import strategies as st

from infernetes.schema.config import build_config
from infernetes.schema.parser import parse_serve_args
from infernetes.schema.render import to_argv

text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=30,
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


def round_trips(**values) -> None:
    config = build_config(**values)
    assert parse_serve_args(to_argv(config)) == config


@settings(max_examples=60, deadline=None)
@given(
    template=text.filter(lambda s: s != "None"),
    role=text,
    model=text.filter(lambda s: not s.startswith("-")),
)
def test_strings(template, role, model):
    round_trips(model=model, chat_template=template, response_role=role)


@settings(max_examples=60, deadline=None)
@given(overrides=st.dictionaries(text, json_values, max_size=4))
def test_json_objects(overrides):
    round_trips(model="m", hf_overrides=overrides)


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(text.filter(lambda s: not s.startswith("-")), min_size=1, max_size=4),
    sizes=st.lists(st.integers(1, 4096), min_size=1, max_size=5),
    length=st.integers(1, 10**7),
    seed=st.integers(-(2**31), 2**31),
)
def test_lists_and_numbers(names, sizes, length, seed):
    round_trips(
        model="m", served_model_name=names, cuda_graph_sizes=sizes, max_model_len=length, seed=seed
    )
