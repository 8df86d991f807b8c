"""catrank with direct segment access (specs/benchmarks.md §3; wire.py for the encoding).

Theory of operation
-------------------
SearchResult (checked against schemas/bench/catrank.capnp at start-up): one data word,
the Float64 score, then the pointers url and snippet.

The client's message is one segment: root pointer, SearchResultList (one pointer), the composite
list's tag, the results (3 words each), then the texts, each NUL-terminated and
zero-padded to a word. No Python loop runs per result on the fast paths: one ``pack`` /
``unpack_from`` of a repeated format (cached per result count) covers all the results,
and everything else is ``map`` / ``accumulate`` / ``itemgetter`` / slice assignment over
whole columns, with per-length tables. (A per-result loop, as before, cost ~1.4 µs per
result on the server; the columns cost ~0.75, half of it the search.)

Client: the texts (url 0, snippet 0, url 1, ...) are padded with NULs as ``str`` and
encoded in one call; if that changes the length, some text is not ASCII and each one is
encoded alone. Text ``k``'s pointer ``lo`` is 4 x its offset + 1; the offset grows from
one text to the next by the previous text's padded words, less the 1 or 2 words the
pointer itself moves on (a url's pointer is 1 word before its snippet's, a snippet's 2
words before the next url's), so one ``accumulate`` over per-length table values yields
every ``lo``.

Server: the text pointers are validated in bulk (kind and element size of every one, from
byte slices of the list through ``translate``); far or null pointers take the general path,
one result at a time, which copies the texts into a one-segment response. The shared
search (catrank.py) runs ``bytes.count`` on each snippet's byte range of the request
segment, never copying a string. The response is two segments: segment 0 holds the root,
the list and the sorted results; segment 1 is the request's segment itself, unchanged and
uncopied, and each result's url and snippet are single-far pointers whose landing pads are
the request's own pointers to them (a landing pad is any ordinary pointer word, and those
already point at the texts within that segment). So the server computes no pointer at
all: a result's far pointers depend only on its index in the request, and the sort just
reorders them. The cost is size: the response also carries the request's old list
(24 bytes per result, unreachable), ~12% more bytes than a one-segment response. The
client's check reads scores until the first one that is not above 1001 (§3 "Check").
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from functools import lru_cache
from itertools import accumulate, chain, cycle, repeat
from operator import add, itemgetter, rshift
from typing import Any

from bench.serialization import catrank
from bench.serialization.base import CheckFailed
from bench.serialization.catrank import adjusted_scores, rank
from bench.serialization.direct.wire import (
    POINTER,
    LayoutError,
    Message,
    check_layout,
    composite_elements,
    list_target,
    root_struct,
    text_at,
)

__all__ = ["DirectCatrank"]

_RESULT = ("<diIiI", ("score", "url", "url", "snippet", "snippet"))
_HEAD = struct.Struct("<iIiIiI")  # root pointer, SearchResultList.results, the list's tag
_ZEROS = tuple(bytes(n) for n in range(9))  # NUL + padding after a text of any length
_FIRST = itemgetter(0)
_CAT = b" cat "
_DOG = b" dog "
_KIND = bytes(b & 3 for b in range(256))  # a pointer's byte 0 -> its kind
_SIZE = bytes(b & 7 for b in range(256))  # a list pointer's byte 4 -> its element size
_FAR_TO_SEGMENT_1 = 1 << 32 | 2  # a single-far pointer word into segment 1, pad word 0

# Per text length L in bytes, grown on demand: NUL + padding (str), the pointer's hi, and
# 4 x padded words less 4 x the words to the next text's pointer (after a url: 1, after a
# snippet: 2).
_PADS: list[str] = []
_HIS: list[int] = []
_STEP_AFTER_URL: list[int] = []
_STEP_AFTER_SNIPPET: list[int] = []
_STEPS = (_STEP_AFTER_URL, _STEP_AFTER_SNIPPET)


def _grow_tables(longest: int) -> None:
    for size in range(len(_PADS), longest + 1):
        words = (size + 8) >> 3  # the text, its NUL and padding
        _PADS.append("\0" * (words * 8 - size))
        _HIS.append((size + 1) << 3 | 2)  # a byte list of size + 1 (the NUL)
        _STEP_AFTER_URL.append(4 * words - 4)
        _STEP_AFTER_SNIPPET.append(4 * words - 8)


@lru_cache(maxsize=1024)
def _list_layout(count: int) -> struct.Struct:
    """``diIiI`` for ``count`` results: all of them in one C call."""
    return struct.Struct("<" + "diIiI" * count)


@lru_cache(maxsize=1024)
def _search_layout(count: int) -> struct.Struct:
    """What the server reads of ``count`` results: score, snippet pointer (lo, hi)."""
    return struct.Struct("<" + "d8xiI" * count)


@lru_cache(maxsize=1024)
def _result_layout(count: int) -> struct.Struct:
    """``count`` results with their pointers as whole words."""
    return struct.Struct("<" + "dqq" * count)


def _pad_texts(texts: list[str]) -> tuple[bytes, list[int]]:
    """The text area for ``texts`` (each NUL-terminated and padded) and their byte sizes.

    ASCII texts (the benchmark's) are padded as ``str`` and encoded in one call; if the
    encoding changes the length, some text is not ASCII and each is encoded alone.
    """
    sizes = list(map(len, texts))
    if sizes:
        _grow_tables(max(sizes))
    padded: list[str] = [""] * (2 * len(texts))
    padded[0::2] = texts
    padded[1::2] = map(_PADS.__getitem__, sizes)
    joined = "".join(padded)
    blob = joined.encode()
    if len(blob) == len(joined):
        return blob, sizes
    encoded = [text.encode() for text in texts]
    sizes = list(map(len, encoded))
    _grow_tables(max(sizes))
    parts: list[bytes] = [b""] * (2 * len(texts))
    parts[0::2] = encoded
    parts[1::2] = [_ZEROS[len(_PADS[size])] for size in sizes]
    return b"".join(parts), sizes


def _permutation(order: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A function that reorders a column by ``order`` in C (an ``itemgetter``)."""
    if len(order) == 1:  # itemgetter of one index returns the item, not a tuple
        only = order[0]
        return lambda column: (column[only],)
    return itemgetter(*order)


class DirectCatrank:
    """catrank on raw segments; messages are ``list[bytes]`` (wire.Message when built)."""

    format = "capnp-direct"

    def __init__(self) -> None:
        schema = catrank.load_schema()
        self._list_type = schema.SearchResultList
        self._list_hi = check_layout(schema.SearchResultList, "<iI", ("results", "results"))
        self._result_hi = check_layout(schema.SearchResult, *_RESULT)
        if self._result_hi != 1 | 2 << 16:
            raise LayoutError("SearchResult must be 1 data word and 2 pointers")
        self._result = struct.Struct(_RESULT[0])

    def _head(self, count: int) -> bytes:
        return _HEAD.pack(0, 1 << 16, 1, (3 * count) << 3 | 7, count << 2, self._result_hi)

    # ------------------------------------------------------------------ client

    def setup(self, inputs: catrank.CatrankInput) -> tuple[Message, int]:
        results, good = inputs
        count = len(results)
        blob, sizes = _pad_texts(list(chain.from_iterable(results)))  # url 0, snippet 0, ..
        # url 0's pointer, word 1 of the list, reaches the text area 3n - 2 words on
        lows = list(accumulate(map(list.__getitem__, cycle(_STEPS), sizes), initial=12 * count - 7))
        his = list(map(_HIS.__getitem__, sizes))
        flat: list[float | int] = [0] * (5 * count)
        flat[0::5] = catrank.scores(count)  # §3 step 1
        flat[1::5] = lows[0 : 2 * count : 2]
        flat[2::5] = his[0::2]
        flat[3::5] = lows[1 : 2 * count : 2]
        flat[4::5] = his[1::2]
        segment = b"".join((self._head(count), _list_layout(count).pack(*flat), blob))
        return Message([segment], self._list_type), good

    # ------------------------------------------------------------------ server

    def handle(self, request: list[bytes]) -> Message:
        seg, first, count = self._results(request)
        buf = request[seg]
        if count and isinstance(buf, bytes) and self._texts_are_plain(buf, first, count):
            response = self._handle_plain(buf, first, count)
            if response is not None:
                return response
        return self._handle_general(request, seg, first, count)

    def _texts_are_plain(self, buf: bytes, first: int, count: int) -> bool:
        """Every text pointer of the list is a byte-list pointer (no far, no null)."""
        end = (first + 3 * count) * 8
        if end > len(buf):
            return False
        region = buf[first * 8 : end]
        return (region[8::24] + region[16::24]).translate(_KIND) == b"\1" * (2 * count) and (
            region[12::24] + region[20::24]
        ).translate(_SIZE) == b"\2" * (2 * count)

    def _handle_plain(self, buf: bytes, first: int, count: int) -> Message | None:
        """The fast path: the response refers to the request's texts by far pointers.

        ``None`` if a snippet lies outside the segment (the general path then decides).
        """
        fields = _search_layout(count).unpack_from(buf, first * 8)  # score, snippet lo, hi
        lows = fields[1::3]
        # snippet i starts at byte 8 (first + 3i + 3) + 2 (lo - 1); its NUL ends at
        # + (hi >> 3), and " cat " cannot span the NUL, so the ranges may include it.
        base = 8 * first + 22
        starts = list(map(add, map(add, lows, lows), range(base, base + 24 * count, 24)))
        ends = list(map(add, starts, map(rshift, fields[2::3], repeat(3, count))))
        if min(starts) < 0 or max(ends) > len(buf):
            return None
        count_in = buf.count
        adjusted = adjusted_scores(
            fields[0::3],
            map(count_in, repeat(_CAT, count), starts, ends),
            map(count_in, repeat(_DOG, count), starts, ends),
        )
        pick = _permutation(rank(adjusted))
        # Result i's url pointer, at word first + 3i + 1 of the request segment, becomes
        # the landing pad of a far pointer (as a word: pad << 3 | 2, segment 1 above).
        pad = 8 * (first + 1) + _FAR_TO_SEGMENT_1
        flat: list[float | int] = [0] * (3 * count)
        flat[0::3] = pick(adjusted)
        flat[1::3] = pick(range(pad, pad + 24 * count, 24))
        flat[2::3] = pick(range(pad + 8, pad + 8 + 24 * count, 24))
        segment = self._head(count) + _result_layout(count).pack(*flat)
        return Message([segment, buf], self._list_type)

    def _handle_general(self, segments: list[bytes], seg: int, first: int, count: int) -> Message:
        """One result at a time: texts behind far or null pointers, or in any order."""
        scored: list[tuple[float, bytes, int, int]] = []
        append = scored.append
        word = first  # the current result's first word
        buf = segments[seg]
        for score, url_lo, url_hi, snippet_lo, snippet_hi in self._result.iter_unpack(
            buf[first * 8 : (first + 3 * count) * 8]
        ):
            append(
                self._slow_result(
                    segments, seg, word, score, url_lo, url_hi, snippet_lo, snippet_hi
                )
            )
            word += 3
        scored.sort(key=_FIRST, reverse=True)  # scores are unique (§3)
        return self._build(scored)

    def _build(self, results: list[tuple[float, bytes, int, int]]) -> Message:
        """One SearchResultList segment from (score, text block, url bytes, snippet bytes).

        The text block holds the url then the snippet, each with NUL and padding, so its
        first ``url_words`` words are the url.
        """
        count = len(results)
        pack = self._result.pack
        parts = [self._head(count)]
        blocks = []
        distance = 3 * count  # words from the current result to its text block
        for score, block, url_len, snippet_len in results:
            url_words = (url_len + 8) >> 3
            # url pointer at result + 1 -> block; snippet pointer at result + 2 -> block + url
            parts.append(
                pack(
                    score,
                    (distance - 2) << 2 | 1,
                    (url_len + 1) << 3 | 2,
                    (distance - 3 + url_words) << 2 | 1,
                    (snippet_len + 1) << 3 | 2,
                )
            )
            blocks.append(block)
            distance += len(block) >> 3
            distance -= 3
        parts += blocks
        return Message([b"".join(parts)], self._list_type)

    def _slow_result(
        self,
        segments: list[bytes],
        seg: int,
        word: int,
        score: float,
        url_lo: int,
        url_hi: int,
        snippet_lo: int,
        snippet_hi: int,
    ) -> tuple[float, bytes, int, int]:
        """Slow path: texts behind far pointers or null; copied out, then re-padded."""
        url = text_at(segments, seg, word + 1, url_lo, url_hi)
        snippet = text_at(segments, seg, word + 2, snippet_lo, snippet_hi)
        if _CAT in snippet:
            score *= 10000.0
        if _DOG in snippet:
            score /= 10000.0
        block = url + _ZEROS[8 - (len(url) & 7)] + snippet + _ZEROS[8 - (len(snippet) & 7)]
        return score, block, len(url), len(snippet)

    def _results(self, segments: list[bytes]) -> tuple[int, int, int]:
        """(segment, first element word, count) of the message's results list."""
        seg, word = root_struct(segments, self._list_hi)
        if word < 0:
            return 0, 0, 0
        lo, hi = POINTER.unpack_from(segments[seg], word * 8)
        seg, word, hi = list_target(segments, seg, word, lo, hi)
        first, count = composite_elements(segments, seg, word, hi, self._result_hi)
        return seg, first, count

    def check(self, response: list[bytes], expectation: int) -> None:
        seg, first, count = self._results(response)
        buf = response[seg]
        good = 0
        for offset in range(first * 8, (first + 3 * count) * 8, 24):
            if struct.unpack_from("<d", buf, offset)[0] > 1001:
                good += 1
            else:
                break  # §3: stop at the first result that is not a cat
        if good != expectation:
            raise CheckFailed(f"catrank: {good} good results, expected {expectation}")
