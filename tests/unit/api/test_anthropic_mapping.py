"""Anthropic Messages bodies → the template's messages and tool plan; content blocks of a
finished message. Pure mapping; the SDK runs against the real server in
tests/integration/test_anthropic_api.py."""

from __future__ import annotations

import pytest

from inferflux.api.anthropic.protocol import MessagesRequest
from inferflux.api.anthropic.render import content_blocks, message_id
from inferflux.api.images import ImageSet
from inferflux.api.tools import ToolCall
from inferflux.errors import InvalidRequest

TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}


def body(**fields: object) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 4, **fields})


def test_tool_turns_become_template_tool_calls_and_results() -> None:
    request = body(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": "Use f."},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Calling."},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "2"},
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ],
    )
    assert request.template_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Use f."},
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
            ],
        },
        {"role": "tool", "content": "2", "tool_call_id": "t1", "name": "f"},
        {"role": "user", "content": "Thanks."},
    ]
    assert not request.continues_final()


def test_tool_choice_maps_to_the_shared_plan() -> None:
    assert body(messages=[{"role": "user", "content": "x"}]).tool_plan(None) is None
    forced = body(
        messages=[{"role": "user", "content": "x"}],
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "f"},
    ).tool_plan(None)
    assert forced is not None and forced.forced == "f" and forced.required
    any_one = body(
        messages=[{"role": "user", "content": "x"}],
        tools=[TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ).tool_plan(None)
    assert any_one is not None and any_one.required and not any_one.parallel
    none = body(
        messages=[{"role": "user", "content": "x"}], tools=[TOOL], tool_choice={"type": "none"}
    )
    assert none.tool_plan(None) is None
    with pytest.raises(InvalidRequest, match="needs tools"):
        body(messages=[{"role": "user", "content": "x"}], tool_choice={"type": "any"}).tool_plan(
            None
        )


def test_image_blocks_become_markers_where_they_stand() -> None:
    png = "iVBORw0KGgo="  # the PNG signature: enough for parsing (probing is the planner's)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    text = {"type": "text", "text": "Compare."}
    images = ImageSet()
    messages = body(messages=[{"role": "user", "content": [image, url, text]}]).template_messages(
        images
    )
    marker = images.marker
    assert messages == [{"role": "user", "content": f"{marker}{marker}Compare."}]
    assert images.refs[0].data == b"\x89PNG\r\n\x1a\n"
    assert images.refs[1].url == "https://example.com/a.png"
    assert images.refs[1].param == "messages[0].content[1].source"
    empty = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with pytest.raises(InvalidRequest) as refused:
        body(messages=[{"role": "user", "content": [empty]}]).template_messages(ImageSet())
    assert refused.value.param == "messages[0].content[0].source"
    with pytest.raises(InvalidRequest, match="image blocks belong in user turns"):
        body(messages=[{"role": "assistant", "content": [image]}]).template_messages(ImageSet())


def test_what_a_text_model_cannot_take_is_refused_by_name() -> None:
    document = {"type": "document", "source": {"type": "text", "data": "x"}}
    request = body(messages=[{"role": "user", "content": [document]}])
    with pytest.raises(InvalidRequest) as refused:
        request.check_supported()
    assert refused.value.param == "messages[0].content[0]"
    with pytest.raises(InvalidRequest):
        body(
            messages=[{"role": "user", "content": "x"}], thinking={"type": "enabled"}
        ).check_supported()
    body(
        messages=[{"role": "user", "content": "x"}], thinking={"type": "disabled"}
    ).check_supported()


def test_a_final_assistant_text_turn_is_a_prefill() -> None:
    request = body(
        messages=[{"role": "user", "content": "Count."}, {"role": "assistant", "content": "one,"}]
    )
    assert request.continues_final()


def test_content_blocks_join_text_and_keep_calls() -> None:
    call = ToolCall("call_1", "f", '{"x": 1}')
    assert content_blocks(["Hel", "lo", call, "\n"]) == [
        {"type": "text", "text": "Hello"},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"x": 1}},
    ]
    assert content_blocks([]) == []
    assert message_id("msg-abc") == "msg_abc"
