"""catrank through the generated codecs (``capsvc gen schemas/bench/catrank.capnp``).

Theory of operation
-------------------
Two ways a user of ``capsvc gen`` writes it, through the generated API only. ``capsvc``
(``CapsvcCatrank``) reads and writes whole results as ``SearchResult.Row`` tuples (url,
score, snippet: the shape msgpack sends, specs/benchmarks.md §8): the request and the
response are each a ``SearchResultList.Row`` of them, which the codec encodes with one
``SearchResultList.encode``; the server reads the request in one
``SearchResult.rows(...)`` call. The client's check reads scores a field at a time, as it
stops at the first low one. ``capsvc-fields`` (``CapsvcFieldsCatrank``) is what follows:
one ``new_message(results=[...])`` from plain
values (a dict per result) on the client; on the server one pass over the request's
results reading each snippet once (specs/benchmarks.md §10 item 3) as a ``str``, the
shared scoring rules of catrank.py (multiply, then divide, only where the word occurs;
one key sort, descending), then a response built the same way, its urls read from the
request's readers. The client counts the leading results with score > 1001 (§3 "Check").
"""

from __future__ import annotations

from operator import itemgetter

from bench.serialization.base import CheckFailed
from bench.serialization.catrank import CatrankInput, scores
from bench.serialization.generated.catrank_capnp import SearchResult, SearchResultList

__all__ = ["CapsvcCatrank", "CapsvcFieldsCatrank"]

_FIRST = itemgetter(0)


class CapsvcCatrank:
    """catrank on generated rows."""

    format = "capsvc"

    def setup(self, inputs: CatrankInput) -> tuple[SearchResultList.Row, int]:
        results, good = inputs
        # §3: the score, url and snippet drawn for each result.
        rows: list[SearchResult.Row] = [
            (url, score, snippet)
            for score, (url, snippet) in zip(scores(len(results)), results, strict=True)
        ]
        return (rows,), good  # (the codec encodes the row)

    def handle(self, request: SearchResultList.Reader) -> SearchResultList.Row:
        scored: list[SearchResult.Row] = []
        append = scored.append
        for url, score, snippet in SearchResult.rows(request.results):
            if " cat " in snippet:
                score *= 10000.0
            if " dog " in snippet:
                score /= 10000.0
            append((url, score, snippet))
        scored.sort(key=_SCORE, reverse=True)  # scores are unique (§3)
        return (scored,)

    def check(self, response: SearchResultList.Reader, expectation: int) -> None:
        count = 0
        for result in response.results:  # §3 "Check": stop at the first score <= 1001
            if result.score > 1001:
                count += 1
            else:
                break
        if count != expectation:
            raise CheckFailed(f"catrank: {count} good results, expected {expectation}")


_SCORE = itemgetter(1)


class CapsvcFieldsCatrank:
    """catrank on generated builders and readers, a field at a time."""

    format = "capsvc-fields"

    def setup(self, inputs: CatrankInput) -> tuple[SearchResultList.Builder, int]:
        results, good = inputs
        # §3: the score, url and snippet drawn for each result.
        message = SearchResultList.new_message(
            results=[
                {"score": score, "url": url, "snippet": snippet}
                for score, (url, snippet) in zip(scores(len(results)), results, strict=True)
            ]
        )
        return message, good

    def handle(self, request: SearchResultList.Reader) -> SearchResultList.Builder:
        scored: list[tuple[float, str, SearchResult.Reader]] = []
        append = scored.append
        for result in request.results:
            score = result.score
            snippet = result.snippet
            if " cat " in snippet:
                score *= 10000.0
            if " dog " in snippet:
                score /= 10000.0
            append((score, snippet, result))
        scored.sort(key=_FIRST, reverse=True)  # scores are unique (§3)
        return SearchResultList.new_message(
            results=[
                {"url": result.url, "score": score, "snippet": snippet}
                for score, snippet, result in scored
            ]
        )

    def check(self, response: SearchResultList.Reader, expectation: int) -> None:
        count = 0
        for result in response.results:  # §3 "Check": stop at the first score <= 1001
            if result.score > 1001:
                count += 1
            else:
                break
        if count != expectation:
            raise CheckFailed(f"catrank: {count} good results, expected {expectation}")
