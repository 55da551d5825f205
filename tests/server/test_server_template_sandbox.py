"""Request-supplied chat templates render in a sandbox process bounded in time, memory and
output; the server's own template renders as before."""

from __future__ import annotations

import time

import pytest
from infernetes.runtime.server.chat_template import ChatRenderer
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.protocol import ChatMessageIn
from infernetes.runtime.server.template_sandbox import TemplateRenderError, TemplateSandbox

LOOP = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def sandbox(tokenizer):
    sandbox = TemplateSandbox(tokenizer)
    yield sandbox
    sandbox.close()


def _messages() -> list[ChatMessageIn]:
    return [
        ChatMessageIn(role="system", content="be brief"),
        ChatMessageIn(role="user", content="hi"),
    ]


def test_request_templates_are_refused_unless_trusted(tokenizer):
    renderer = ChatRenderer(tokenizer, LOOP, "auto")
    assert renderer.render(_messages()) == "[system] be brief[user] hi"
    with pytest.raises(APIError) as info:
        renderer.render(_messages(), template=LOOP)
    assert info.value.status == 400 and info.value.param == "chat_template"


def test_sandbox_renders_what_the_tokenizer_renders(tokenizer):
    trusted = ChatRenderer(tokenizer, None, "auto", trust_request_templates=True)
    try:
        template = tokenizer.chat_template or LOOP
        for continue_final in (False, True):
            messages = [*_messages(), ChatMessageIn(role="assistant", content="Well,")]
            kwargs = dict(
                add_generation_prompt=not continue_final, continue_final_message=continue_final
            )
            expected = ChatRenderer(tokenizer, template, "auto").render(messages, **kwargs)
            assert trusted.render(messages, template=template, **kwargs) == expected
    finally:
        trusted.sandbox.close()


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ 'x' * 30000000 }}", "characters"),
        ("{{ 'x' * 10**10 }}", "memory"),
        ("{% for i in range(10**6) %}{% endfor %}", "OverflowError"),
        ("{{ raise_exception('no system messages, please') }}", "no system messages"),
        ("{% for %}", "TemplateSyntaxError"),
    ],
)
def test_hostile_templates_fail_with_a_reason(sandbox, template, message):
    with pytest.raises(TemplateRenderError, match=message):
        sandbox.render([{"role": "user", "content": "hi"}], chat_template=template)


def test_a_template_past_its_deadline_is_killed_and_the_next_renders(sandbox):
    forever = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(TemplateRenderError, match="did not finish within 1 s"):
        sandbox.render([{"role": "user", "content": "hi"}], timeout_s=1, chat_template=forever)
    assert time.monotonic() - started < 5
    assert sandbox.render([{"role": "user", "content": "hi"}], chat_template=LOOP) == "[user] hi"
