"""ChatTemplate: Hugging Face conventions in a sandbox, fallbacks per architecture, errors."""

from __future__ import annotations

import pytest

from inferflux.engine.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate
from inferflux.errors import InvalidRequest, ModelLoadError

# Shaped like SmolLM2's template: a default system prompt, ChatML turns.
SMOLLM_LIKE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def make(template: str | None, architecture: str = "llama") -> ChatTemplate:
    return ChatTemplate.from_model(template, architecture, "<s>", "</s>")


def test_model_template_renders_with_generation_prompt() -> None:
    text = make(SMOLLM_LIKE).render([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chatml_fallback_for_other_architectures() -> None:
    template = make(None, "llama")
    assert template.is_fallback and template.source == CHATML_TEMPLATE
    assert template.render(CONVERSATION) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("architecture", ["gemma", "gemma2", "gemma3"])
def test_gemma_fallback_turns(architecture: str) -> None:
    template = ChatTemplate.from_model(None, architecture, "<bos>", "<eos>")
    assert template.source == GEMMA_TEMPLATE
    assert template.render(CONVERSATION) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_fallback_without_system() -> None:
    template = ChatTemplate.from_model(None, "gemma3", "<bos>", "<eos>")
    text = template.render([{"role": "user", "content": "Hi"}])
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_blank_template_uses_fallback() -> None:
    assert make("   ").is_fallback


def test_add_generation_prompt_false() -> None:
    text = make(None).render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n"


def test_bos_and_eos_tokens_are_variables() -> None:
    template = make("{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}")
    assert template.render([{"role": "user", "content": "x"}]) == "<s>x</s>"


def test_trim_and_lstrip_blocks() -> None:
    source = "{% for m in messages %}\n    {{ m['content'] }}\n{% endfor %}"
    assert make(source).render([{"role": "user", "content": "a"}]) == "    a\n"


def test_raise_exception_becomes_invalid_request() -> None:
    source = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversation roles must start with user') }}{% endif %}ok"
    )
    with pytest.raises(InvalidRequest) as info:
        make(source).render([{"role": "assistant", "content": "x"}])
    assert info.value.param == "messages"
    assert "Conversation roles must start with user" in info.value.message
    assert info.value.http_status == 400


def test_runtime_error_in_template_becomes_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="failed"):
        make("{{ messages[5]['content'] + 1 }}").render([{"role": "user", "content": "x"}])


def test_tojson_keeps_non_ascii_and_does_not_html_escape() -> None:
    template = make("{{ messages[0] | tojson }}")
    text = template.render([{"role": "user", "content": "héllo <b>"}])
    assert text == '{"role": "user", "content": "héllo <b>"}'


def test_tojson_indent() -> None:
    template = make("{{ messages[0]['content'] | tojson(indent=2) }}")
    assert template.render([{"role": "user", "content": "x"}]) == '"x"'


def test_strftime_now() -> None:
    text = make("{{ strftime_now('%Y') }}").render([{"role": "user", "content": "x"}])
    assert text.isdigit() and len(text) == 4


def test_sandbox_blocks_attribute_escape() -> None:
    source = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(InvalidRequest):
        make(source).render([{"role": "user", "content": "x"}])


def test_sandbox_is_immutable() -> None:
    with pytest.raises(InvalidRequest):
        make("{{ messages.append(1) }}").render([{"role": "user", "content": "x"}])


def test_loop_controls() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    text = make(source).render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert text == "a"


def test_syntax_error_is_a_model_load_error() -> None:
    with pytest.raises(ModelLoadError, match="does not compile"):
        make("{% for %}")
