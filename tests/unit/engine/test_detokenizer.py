"""IncrementalDetokenizer and StopMatcher: pure logic over bytes and text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inferflux.engine.detokenizer import IncrementalDetokenizer, StopMatcher


def test_multibyte_character_split_across_pieces_is_held_until_complete() -> None:
    detok = IncrementalDetokenizer()
    euro = "€".encode()  # 3 bytes
    assert detok.push(b"a" + euro[:1]) == "a"
    assert detok.push(euro[1:2]) == ""
    assert detok.push(euro[2:] + b"b") == "€b"
    assert detok.flush() == ""


def test_dangling_partial_character_becomes_replacement_on_flush() -> None:
    detok = IncrementalDetokenizer()
    assert detok.push("😀".encode()[:2]) == ""
    assert detok.flush() == "\ufffd"


@given(st.text(max_size=40), st.lists(st.integers(min_value=1, max_value=5), max_size=40))
def test_any_split_of_valid_utf8_reassembles_exactly(text: str, cuts: list[int]) -> None:
    data = text.encode()
    detok = IncrementalDetokenizer()
    out, pos = [], 0
    for cut in cuts:
        out.append(detok.push(data[pos : pos + cut]))
        pos += cut
    out.append(detok.push(data[pos:]))
    out.append(detok.flush())
    assert "".join(out) == text
    assert all("\ufffd" not in chunk for chunk in out)


def test_stop_string_split_across_chunks_is_never_released() -> None:
    stop = StopMatcher(["END"])
    assert stop.push("hello E") == ("hello ", None)
    assert stop.push("N") == ("", None)
    assert stop.push("D and more") == ("", "END")


def test_false_start_of_a_stop_string_is_released_once_ruled_out() -> None:
    stop = StopMatcher(["END"])
    assert stop.push("an EN") == ("an ", None)
    assert stop.push("ding") == ("ENding", None)
    assert stop.flush() == ""


def test_earliest_of_several_stop_strings_wins() -> None:
    stop = StopMatcher(["world", "lo w"])
    assert stop.push("hello world") == ("hel", "lo w")


def test_held_text_is_released_by_flush_at_the_end() -> None:
    stop = StopMatcher(["###"])
    assert stop.push("answer #") == ("answer ", None)
    assert stop.flush() == "#"


def test_no_stop_strings_pass_text_through() -> None:
    stop = StopMatcher([])
    assert stop.push("anything") == ("anything", None)


@given(
    st.text(alphabet="abc#", max_size=30),
    st.text(alphabet="abc#", min_size=1, max_size=4),
    st.lists(st.integers(min_value=1, max_value=4), max_size=30),
)
def test_streamed_output_equals_text_cut_at_the_first_stop(
    text: str, stop_str: str, cuts: list[int]
) -> None:
    matcher = StopMatcher([stop_str])
    emitted, matched, pos = [], None, 0
    pieces = []
    for cut in cuts:
        pieces.append(text[pos : pos + cut])
        pos += cut
    pieces.append(text[pos:])
    for piece in pieces:
        out, matched = matcher.push(piece)
        emitted.append(out)
        if matched:
            break
    if not matched:
        emitted.append(matcher.flush())
    at = text.find(stop_str)
    expected = text if at == -1 else text[:at]
    assert "".join(emitted) == expected
    assert (matched is not None) == (at != -1)
