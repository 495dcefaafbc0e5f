"""Server-sent events read by line (core.sse): the specification's fields, any line ending, any cut."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.sse import DONE, EventTooLarge, Framer, data, events, normalize


def test_an_event_s_data_is_its_data_lines_joined_and_other_fields_carry_none() -> None:
    assert data(b"data: {}") == b"{}"
    assert data(b"data:{}") == b"{}"  # the one space after the colon is optional
    assert data(b"data:  x") == b" x"  # only one is dropped
    assert data(b"event: ping\nid: 3\ndata: a\ndata: b") == b"a\nb"
    assert data(b": a comment\nevent: ping") is None
    assert data(b'data: {"content":"data: [DONE]"}') == b'{"content":"data: [DONE]"}' != DONE


def test_a_bare_data_line_adds_an_empty_line_and_an_empty_read_keeps_a_pending_cr() -> None:
    assert data(b"data\ndata: b") == b"\nb"
    framer = Framer()
    out = framer.feed(b"data: a\r") + framer.feed(b"") + framer.feed(b"\ndata: b\r\n\r\n")
    assert [data(e) for e in events(out)] == [b"a\nb"]  # the \r\n across the reads is one line end


def test_every_line_ending_frames_the_same_events() -> None:
    lf = b"data: 1\n\ndata: 2\n\n"
    for block in (lf, lf.replace(b"\n", b"\r\n"), lf.replace(b"\n", b"\r")):
        assert events(normalize(block)) == [b"data: 1", b"data: 2"]


def test_an_endless_event_is_refused_past_its_bound() -> None:
    framer = Framer(max_event_bytes=100)
    assert framer.feed(b"data: " + b"x" * 60) == b""
    with pytest.raises(EventTooLarge):
        framer.feed(b"x" * 60)


stream_events = st.lists(
    st.lists(
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=12),
        min_size=1,
        max_size=3,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(stream_events, st.sampled_from([b"\n", b"\r\n", b"\r"]), st.lists(st.integers(0, 400), max_size=8))
def test_however_a_stream_is_cut_into_reads_the_same_events_come_out(
    evs: list[list[str]], eol: bytes, cuts: list[int]
) -> None:
    """The events a stream holds, framed from reads cut anywhere (even inside ``\\r\\n``)."""
    raw = b"".join(b"".join(b"data: " + line.encode() + eol for line in ev) + eol for ev in evs)
    framer, out, at = Framer(), b"", 0
    for cut in sorted({c for c in cuts if c < len(raw)}):
        out += framer.feed(raw[at:cut])
        at = cut
    out += framer.feed(raw[at:]) + framer.flush()
    assert [data(e) for e in events(out)] == [b"\n".join(line.encode() for line in ev) for ev in evs]
