"""catrank with direct segment access (specs/benchmarks.md §3; wire.py for the encoding).

Theory of operation
-------------------
SearchResult (checked against schemas/bench/catrank.capnp at start-up): one data word,
the Float64 score, then the pointers url and snippet.

The writer lays a list out in one segment: root pointer, SearchResultList (one pointer),
the composite list's tag, the results (3 words each), then per result its url text and
its snippet text, each NUL-terminated and zero-padded to a word. A result is one
``Struct.pack``; the texts are ``encode()``-d once, and one ``join`` assembles the
segment from the packed results, the texts and ready-made runs of zero bytes.

The server never decodes a string. It walks the results with one ``iter_unpack``, finds
``" cat "`` and ``" dog "`` with ``bytes.find`` inside the snippet's byte range of the
request segment (Cap'n Proto's zero-copy text; catrank is where the spec expects it to
help, §9), sorts, and builds the response by copying each result's text bytes, padding
included, as one slice when url and snippet are adjacent (two otherwise), with pointers
recomputed for the new positions. The client's check reads scores until the first one
that is not above 1001 (§3 "Check").
"""

from __future__ import annotations

import struct
from operator import itemgetter

from bench.serialization import catrank
from bench.serialization.base import CheckFailed
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

    def _build(self, results: list[tuple[float, bytes, int, int]]) -> Message:
        """One SearchResultList segment from (score, text block, url bytes, snippet bytes).

        The text block holds the url then the snippet, each with NUL and padding, so its
        first ``url_words`` words are the url.
        """
        count = len(results)
        pack = self._result.pack
        parts = [_HEAD.pack(0, 1 << 16, 1, (3 * count) << 3 | 7, count << 2, self._result_hi)]
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

    # ------------------------------------------------------------------ client

    def setup(self, inputs: catrank.CatrankInput) -> tuple[Message, int]:
        results, good = inputs
        count = len(results)
        pack = self._result.pack
        zeros = _ZEROS
        parts = [_HEAD.pack(0, 1 << 16, 1, (3 * count) << 3 | 7, count << 2, self._result_hi)]
        append = parts.append
        texts: list[bytes] = []
        extend = texts.extend
        distance = 3 * count  # words from the current result to its url text
        score = 1000.0  # §3 step 1: score = 1000 - i
        for url, snippet in results:
            url_b = url.encode()
            snippet_b = snippet.encode()
            url_len = len(url_b)
            snippet_len = len(snippet_b)
            url_words = (url_len + 8) >> 3  # text + NUL, padded to words
            snippet_words = (snippet_len + 8) >> 3
            # url pointer at result + 1 -> the url; snippet pointer at result + 2 -> after it
            append(
                pack(
                    score,
                    (distance - 2) << 2 | 1,
                    (url_len + 1) << 3 | 2,
                    (distance - 3 + url_words) << 2 | 1,
                    (snippet_len + 1) << 3 | 2,
                )
            )
            extend(
                (
                    url_b,
                    zeros[url_words * 8 - url_len],
                    snippet_b,
                    zeros[snippet_words * 8 - snippet_len],
                )
            )
            distance += url_words + snippet_words - 3
            score -= 1.0
        parts += texts
        return Message([b"".join(parts)], self._list_type), good

    # ------------------------------------------------------------------ server

    def handle(self, request: list[bytes]) -> Message:
        seg, first, count = self._results(request)
        buf = request[seg]
        find = buf.find
        scored: list[tuple[float, bytes, int, int]] = []
        append = scored.append
        word = first  # the current result's first word
        with memoryview(buf) as view:
            for score, url_lo, url_hi, snippet_lo, snippet_hi in self._result.iter_unpack(
                view[first * 8 : (first + 3 * count) * 8]
            ):
                if url_lo & 3 == 1 and snippet_lo & 3 == 1 and url_hi & 7 == 2 == snippet_hi & 7:
                    url_start = (word + 2 + (url_lo >> 2)) * 8
                    url_len = (url_hi >> 3) - 1
                    start = (word + 3 + (snippet_lo >> 2)) * 8
                    snippet_len = (snippet_hi >> 3) - 1
                    end = start + snippet_len
                    if find(_CAT, start, end) >= 0:
                        score *= 10000.0
                    if find(_DOG, start, end) >= 0:
                        score /= 10000.0
                    url_padded = url_start + ((url_len + 8) & ~7)
                    if url_padded == start:  # adjacent texts: one slice, padding included
                        block = buf[url_start : start + ((snippet_len + 8) & ~7)]
                    else:
                        block = (
                            buf[url_start:url_padded]
                            + buf[start : start + ((snippet_len + 8) & ~7)]
                        )
                    append((score, block, url_len, snippet_len))
                else:
                    append(
                        self._slow_result(
                            request, seg, word, score, url_lo, url_hi, snippet_lo, snippet_hi
                        )
                    )
                word += 3
        scored.sort(key=_FIRST, reverse=True)  # scores are unique (§3)
        return self._build(scored)

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
