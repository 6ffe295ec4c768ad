"""Chat templates: OpenAI-style messages → the prompt text a model was trained on.

This module owns rendering only; tokenizing the result is the caller's job. Templates are
Jinja, run in an `ImmutableSandboxedEnvironment` (a template from a downloaded GGUF is
untrusted code) with the conventions of Hugging Face `apply_chat_template`: `trim_blocks`,
`lstrip_blocks`, `{% break %}`/`{% continue %}`, the globals `raise_exception` and
`strftime_now`, a `tojson` filter that keeps non-ASCII text, and the variables `messages`,
`add_generation_prompt`, `bos_token`, `eos_token`.

A GGUF without `tokenizer.chat_template` gets a fallback chosen by architecture:

- `gemma`, `gemma2`, `gemma3`: Gemma turns, `<start_of_turn>user\\n…<end_of_turn>\\n`, ending
  with `<start_of_turn>model\\n`. Role `assistant` renders as `model`; a system message is
  prepended (with a blank line) to the first user turn, since Gemma has no system role.
- everything else: ChatML, `<|im_start|>{role}\\n{content}<|im_end|>\\n`, ending with
  `<|im_start|>assistant\\n`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inferflux.errors import InvalidRequest, ModelLoadError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + message['content'] + '\n\n' %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{% set content = message['content'] %}"
    "{% if role == 'user' and ns.system %}"
    "{% set content = ns.system + content %}{% set ns.system = '' %}"
    "{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + content + '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

_GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})

ChatMessage = Mapping[str, object]


class ChatTemplateError(jinja2.TemplateError):
    """Raised by a template's own `raise_exception(...)` call."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: object,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Hugging Face's tojson: no HTML escaping, non-ASCII kept as is.
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env


def fallback_template(architecture: str) -> str:
    """The template used when a GGUF carries none: Gemma turns or ChatML (module docstring)."""
    return GEMMA_TEMPLATE if architecture in _GEMMA_ARCHITECTURES else CHATML_TEMPLATE


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A compiled chat template plus the special-token texts it may reference.

    Immutable and safe to share across requests and threads.
    """

    source: str
    bos_text: str
    eos_text: str
    is_fallback: bool
    _template: jinja2.Template

    @classmethod
    def from_model(
        cls, template_text: str | None, architecture: str, bos_text: str, eos_text: str
    ) -> ChatTemplate:
        """Compile `template_text`, or the architecture's fallback when it is None or blank.

        Raises ModelLoadError when the template does not compile (the model cannot chat).
        """
        is_fallback = not (template_text and template_text.strip())
        source = fallback_template(architecture) if is_fallback else str(template_text)
        try:
            template = _make_environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ModelLoadError(f"the chat template does not compile: {exc}") from None
        return cls(source, bos_text, eos_text, is_fallback, template)

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, object]] | None = None,
    ) -> str:
        """The prompt text for `messages` (each a mapping with at least role and content).
        `tools` (OpenAI tool objects) is passed as the template variable `tools`, as
        Hugging Face's `apply_chat_template` does; None leaves it undefined.

        Raises InvalidRequest (param `messages`) when the template rejects the conversation
        (its `raise_exception`) or fails on it.
        """
        extra: dict[str, object] = {}
        if tools is not None:
            extra["tools"] = [dict(tool) for tool in tools]
        try:
            return self._template.render(
                messages=[dict(message) for message in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_text,
                eos_token=self.eos_text,
                **extra,
            )
        except ChatTemplateError as exc:
            raise InvalidRequest(
                f"the model's chat template rejected the messages: {exc}", param="messages"
            ) from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise InvalidRequest(
                f"the model's chat template failed on these messages ({type(exc).__name__}: {exc})",
                param="messages",
            ) from None
