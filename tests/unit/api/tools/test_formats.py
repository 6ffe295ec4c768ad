"""Format detection from template sources of each family."""

from __future__ import annotations

import pytest

from inferflux.api.tools.formats import GENERIC, HERMES, LLAMA3, MISTRAL, detect_tool_format
from inferflux.engine.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE
from tests.unit.api.tools.templates import LLAMA31, MISTRAL_V3, QWEN25, SMOLLM2


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (QWEN25, HERMES),
        (LLAMA31, LLAMA3),
        (MISTRAL_V3, MISTRAL),
        (SMOLLM2, GENERIC),
        (CHATML_TEMPLATE, GENERIC),
        ("{{ '<|start_header_id|>user<|end_header_id|>' }}", GENERIC),  # Llama 3 without tools
    ],
)
def test_the_template_source_picks_the_format(source: str, expected: object) -> None:
    assert detect_tool_format(source) is expected


def test_fallback_templates_are_generic_whatever_they_contain() -> None:
    assert detect_tool_format(GEMMA_TEMPLATE, is_fallback=True) is GENERIC
    assert detect_tool_format(QWEN25, is_fallback=True) is GENERIC


def test_native_formats_render_tools_in_the_template_and_generic_does_not() -> None:
    assert HERMES.native and LLAMA3.native and MISTRAL.native
    assert not GENERIC.native
    assert not LLAMA3.parallel  # one call per turn
    assert GENERIC.trigger == HERMES.trigger == "<tool_call>"
