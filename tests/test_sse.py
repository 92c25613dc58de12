"""The incremental SSE parser (harness/protocols/sse.py): the WHATWG event-stream rules,
any byte split giving the same events, the time of each event, and truncation at close.

The recorded streams are the reference LLM server's own bytes (its app in this process).
"""

from __future__ import annotations

import random

import pytest

from harness.protocols.openai import Generation, chat_body
from harness.protocols.sse import SSEEvent, SSEParser, parse_stream
from harness.testing.llm_streams import MODEL, record_stream


def _feed_pieces(body: bytes, cuts: list[int]) -> tuple[list[SSEEvent], SSEParser]:
    """``body`` fed in the pieces ``cuts`` makes, piece i at time i; then closed."""
    parser = SSEParser()
    events: list[SSEEvent] = []
    bounds = [0, *cuts, len(body)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        events += parser.feed(body[a:b], float(i))
    last = parser.close(float(len(bounds)))
    if last is not None:
        events.append(last)
    return events, parser


def _shape(events: list[SSEEvent]) -> list[tuple[str, str, str | None, bool]]:
    return [(e.data, e.event, e.id, e.truncated) for e in events]


@pytest.fixture(scope="module")
def chat_stream() -> bytes:
    body = chat_body(
        MODEL, [{"role": "user", "content": "Tell me a story"}], Generation(max_tokens=12)
    )
    return record_stream(body).raw


@pytest.fixture(scope="module")
def crlf_stall_stream() -> bytes:
    """\\r\\n framing, keep-alive comments (a stalled stream), several tokens per event."""
    body = chat_body(
        MODEL,
        [{"role": "user", "content": "Tell me a story"}],
        Generation(max_tokens=12, ignore_eos=True),
    )
    return record_stream(body, "crlf-framing", "stream-stall:0.02", "coalesce:2").raw


def test_every_split_point_of_a_recorded_stream_gives_the_same_events(
    chat_stream: bytes, crlf_stall_stream: bytes
) -> None:
    for raw in (chat_stream, crlf_stall_stream):
        whole, parser = parse_stream(raw)
        assert whole and whole[-1].data == "[DONE]" and not parser.ended_mid_event
        for cut in range(1, len(raw)):
            events, _ = _feed_pieces(raw, [cut])
            assert _shape(events) == _shape(whole), f"split at byte {cut} of {len(raw)}"


def test_random_multi_splits_and_one_byte_at_a_time_give_the_same_events(
    crlf_stall_stream: bytes,
) -> None:
    raw = crlf_stall_stream
    whole, parser = parse_stream(raw)
    assert parser.comments >= 1  # the stall's keep-alives were read, not made events
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(raw)), rng.randint(2, 40)))
        events, p = _feed_pieces(raw, cuts)
        assert _shape(events) == _shape(whole)
        assert p.comments == parser.comments
    events, _ = _feed_pieces(raw, list(range(1, len(raw))))
    assert _shape(events) == _shape(whole)


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_every_line_end_of_the_spec_frames_the_same_events(end: bytes) -> None:
    lines = [b"event: add", b"data: 1", b"data: 2", b"", b": ping", b"id: 7", b"data: x", b""]
    raw = end.join(lines) + end
    events, parser = parse_stream(raw)
    assert _shape(events) == [("1\n2", "add", None, False), ("x", "message", "7", False)]
    assert parser.comments == 1
    for cut in range(1, len(raw)):  # including between the \r and the \n of one line end
        assert _shape(_feed_pieces(raw, [cut])[0]) == _shape(events)


def test_a_cr_ending_a_piece_ends_its_line_then_a_leading_lf_is_not_a_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r", 1.0) == []
    # the "\n" completes the "\r\n" of "data: a"; the next "\r\n" is the blank line
    [event] = parser.feed(b"\n\r\n", 2.0)
    assert (event.data, event.at) == ("a", 2.0)
    # a lone "\r" then "\r": two line ends, the second blank: the event is out at once
    [event] = parser.feed(b"data: b\r", 3.0) + parser.feed(b"\r", 4.0)
    assert (event.data, event.at) == ("b", 4.0)


def test_each_event_has_the_time_of_the_feed_that_completed_it() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a"', 1.0) == []
    assert parser.feed(b":1}\n", 2.0) == []
    [first] = parser.feed(b"\ndata: second\n", 3.0)
    [second] = parser.feed(b"\n", 4.5)
    assert (first.data, first.at) == ('{"a":1}', 3.0)
    assert (second.data, second.at) == ("second", 4.5)


def test_comments_are_counted_with_their_time_and_are_never_events() -> None:
    parser = SSEParser()
    assert parser.feed(b": keep-alive\r\n\r\n: keep-alive\n\n", 5.0) == []
    assert (parser.comments, parser.last_comment_at) == (2, 5.0)


def test_fields_follow_the_spec() -> None:
    raw = (
        b"data\n\n"  # a field without a colon: data with an empty value
        b"data:no space\n\n"  # no space after the colon: nothing removed
        b"data:  two spaces\n\n"  # only one space is removed
        b"event: tick\n\n"  # no data: nothing dispatched, and the type is reset
        b"data: after\n\n"
        b"id: 1\ndata: a\n\n"
        b"id: bad\x00id\ndata: b\n\n"  # an id holding NUL is ignored: the last id stays
        b"retry: 2500\nretry: soon\nunknown: field\ndata: c\n\n"
    )
    events, parser = parse_stream(raw)
    assert _shape(events) == [
        ("", "message", None, False),
        ("no space", "message", None, False),
        (" two spaces", "message", None, False),
        ("after", "message", None, False),
        ("a", "message", "1", False),
        ("b", "message", "1", False),
        ("c", "message", "1", False),
    ]
    assert parser.retry_ms == 2500


def test_a_byte_order_mark_is_dropped_even_when_split() -> None:
    raw = b"\xef\xbb\xbfdata: x\n\n"
    for cut in range(1, 4):
        assert _shape(_feed_pieces(raw, [cut])[0]) == [("x", "message", None, False)]


def test_a_character_split_across_pieces_is_decoded_whole() -> None:
    raw = "data: héllo ✓\n\n".encode()
    for cut in range(1, len(raw)):
        assert _feed_pieces(raw, [cut])[0][0].data == "héllo ✓"


def test_an_event_the_stream_ends_inside_is_returned_truncated_by_close() -> None:
    parser = SSEParser()
    [done] = parser.feed(b"data: 1\n\ndata: [DONE]\ndata: more", 1.0)
    assert done.data == "1"
    last = parser.close(2.0)
    assert last == SSEEvent("[DONE]\nmore", "message", None, 2.0, truncated=True)
    assert parser.ended_mid_event
    with pytest.raises(ValueError, match="after close"):
        parser.feed(b"data: x\n\n", 3.0)


def test_a_stream_that_ends_after_a_whole_event_is_not_truncated() -> None:
    parser = SSEParser()
    parser.feed(b"data: 1\n\n", 1.0)
    assert parser.close(2.0) is None and not parser.ended_mid_event


@pytest.mark.parametrize("tail", [b"event: x\nda", b": keep-al"], ids=["fields", "comment"])
def test_a_stream_cut_where_no_data_was_pending_ends_mid_event_with_nothing_returned(
    tail: bytes,
) -> None:
    parser = SSEParser()
    parser.feed(b"data: 1\n\n" + tail, 1.0)
    assert parser.close(2.0) is None and parser.ended_mid_event
