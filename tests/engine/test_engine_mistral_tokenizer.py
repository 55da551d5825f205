"""``--tokenizer-mode mistral``: a tiny Mistral with a ``tekken.json`` written here. Prompts and
chats are mistral_common's own encoding, greedy outputs match transformers on those ids, text
is the Tekken decoding, and both structured-output backends build their vocabulary from it."""

from __future__ import annotations

import pytest
from infernetes.runtime.llm import LLM
from infernetes.runtime.sampling_params import SamplingParams, StructuredOutputsParams
from infernetes.runtime.testing_tekken import make_tiny_tekken_mistral
from infernetes.runtime.tokenization.mistral import MistralTokenizer
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer as Reference

SMALL = dict(device="cpu", max_model_len=256, enforce_eager=True)
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def tekken_model(tmp_path_factory):
    return make_tiny_tekken_mistral(tmp_path_factory.mktemp("tekken_mistral"))


@pytest.fixture(scope="module")
def llm(tekken_model):
    return LLM(str(tekken_model), tokenizer_mode="mistral", **SMALL)


@pytest.fixture(scope="module")
def reference(tekken_model):
    return Reference.from_file(str(tekken_model / "tekken.json"))


def test_completion_prompt_is_tekken_encoding_and_output_matches_transformers(
    llm, reference, tekken_model, hf_greedy
):
    prompt = "The quick brown fox, café 日本語"
    [out] = llm.generate([prompt], GREEDY)
    tekken = reference.instruct_tokenizer.tokenizer
    assert out.prompt_token_ids == tekken.encode(prompt, bos=True, eos=False)
    ids = list(out.outputs[0].token_ids)
    assert ids == hf_greedy(tekken_model, out.prompt_token_ids, 12)
    # The incremental detokenizer's text: the whole decoding, less a trailing incomplete
    # character (a random model's bytes need not end one), as with any tokenizer.
    assert out.outputs[0].text == tekken.decode(ids).rstrip("\ufffd")


def test_chat_is_mistral_commons_encoding(llm, reference, tekken_model, hf_greedy):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    [out] = llm.chat(messages, GREEDY)
    expected = reference.encode_chat_completion(ChatCompletionRequest.from_openai(messages))
    assert out.prompt_token_ids == expected.tokens
    assert list(out.outputs[0].token_ids) == hf_greedy(tekken_model, expected.tokens, 12)


def test_chat_with_tools_and_tool_results(llm, reference):
    tokenizer = llm.get_tokenizer()
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "abcDEF123",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "18 degrees"},
    ]
    ids = tokenizer.encode_chat(messages, [WEATHER_TOOL])
    request = ChatCompletionRequest.from_openai(messages, tools=[WEATHER_TOOL])
    assert ids == reference.encode_chat_completion(request).tokens
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert "[AVAILABLE_TOOLS]" in text and "[TOOL_RESULTS]" in text and "get_weather" in text


def test_a_conversation_mistral_common_refuses_is_a_value_error(llm):
    with pytest.raises(ValueError, match="must start with a user message"):
        llm.get_tokenizer().encode_chat([{"role": "assistant", "content": "hi"}], None)


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_structured_output_over_the_tekken_vocabulary(tekken_model, backend):
    llm = LLM(
        str(tekken_model),
        tokenizer_mode="mistral",
        structured_outputs_config={"backend": backend},
        **SMALL,
    )
    choice = StructuredOutputsParams("choice", ["Paris", "São Paulo"], "structured_outputs")
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 6}},
        "required": ["city"],
        "additionalProperties": False,
    }
    json_params = StructuredOutputsParams("json", schema, "structured_outputs")
    picked, as_json = llm.generate(
        ["The city is", "Weather:"],
        [
            SamplingParams(max_tokens=12, temperature=0, structured_outputs=choice),
            SamplingParams(max_tokens=40, temperature=0, structured_outputs=json_params),
        ],
    )
    assert picked.outputs[0].text in ("Paris", "São Paulo")
    assert as_json.outputs[0].finish_reason == "stop"
    import json

    assert set(json.loads(as_json.outputs[0].text)) == {"city"}


def test_auto_mode_keeps_the_hugging_face_tokenizer(tekken_model):
    from infernetes.runtime.engine.engine_config import resolve_config

    from infernetes.schema.config import build_config

    _, tokenizer = resolve_config(build_config(str(tekken_model), device="cpu"), environ={})
    assert not isinstance(tokenizer, MistralTokenizer)
    assert tokenizer.chat_template  # the tiny models' Jinja template


def test_mistral_mode_without_a_tekken_file_is_refused(tiny_llama, tmp_path):
    from infernetes.runtime.engine.engine_config import resolve_config

    from infernetes.schema.config import build_config

    with pytest.raises(ValueError, match=r"tekken.json.*it has none"):
        resolve_config(
            build_config(str(tiny_llama), tokenizer_mode="mistral", device="cpu"), environ={}
        )
    (tmp_path / "tokenizer.model.v3").write_bytes(b"")
    with pytest.raises(ValueError, match=r"SentencePiece file.*tokenizer.model.v3"):
        resolve_config(
            build_config(str(tiny_llama), tokenizer=str(tmp_path), tokenizer_mode="mistral"),
            environ={},
        )
