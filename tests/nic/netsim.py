"""A simulated lossy wire between two StreamMux objects, on a virtual clock.

Frames leave a mux's outbox, suffer loss / duplication / reordering (a random extra delay)
and arrive after ``delay``; the clock jumps straight to the next event (delivery or a mux
timer), so seconds of protocol time cost milliseconds.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

from capsvc.nicdriver.mux import StreamMux
from capsvc.nicdriver.stream import StreamConfig

MAC_A = b"\x02\0\0\0\0\x0a"
MAC_B = b"\x02\0\0\0\0\x0b"


class Net:
    def __init__(
        self,
        *,
        loss: float = 0.0,
        dup: float = 0.0,
        reorder: float = 0.0,
        seed: int = 0,
        delay: float = 0.0002,
        config: StreamConfig | None = None,
    ) -> None:
        self.random = random.Random(seed)
        self.a = StreamMux(MAC_A, config, rng=random.Random(seed + 1))
        self.b = StreamMux(MAC_B, config, rng=random.Random(seed + 2))
        self.loss, self.dup, self.reorder, self.delay = loss, dup, reorder, delay
        self.now = 0.0
        self.events: list[tuple[float, int, StreamMux, bytes]] = []
        self.counter = 0
        self.frames = 0
        self.down = False  # cable pulled: everything is lost

    def _send(self, source: StreamMux) -> None:
        target = self.b if source is self.a else self.a
        for frame in source.take_output():
            self.frames += 1
            if self.down or self.random.random() < self.loss:
                continue
            copies = 2 if self.random.random() < self.dup else 1
            for _ in range(copies):
                extra = (
                    self.delay * self.random.uniform(1, 8)
                    if self.random.random() < self.reorder
                    else 0
                )
                self.counter += 1
                heapq.heappush(
                    self.events, (self.now + self.delay + extra, self.counter, target, frame)
                )

    def flush(self) -> None:
        self._send(self.a)
        self._send(self.b)

    def step(self) -> bool:
        """Advance to the next event; False if nothing is scheduled."""
        self.flush()
        candidates = [t for t in (self.a.next_deadline(), self.b.next_deadline()) if t is not None]
        if self.events:
            candidates.append(self.events[0][0])
        if not candidates:
            return False
        self.now = max(self.now, min(candidates))
        while self.events and self.events[0][0] <= self.now:
            _, _, target, frame = heapq.heappop(self.events)
            target.receive_frame(frame, self.now)
        self.a.poll(self.now)
        self.b.poll(self.now)
        self.flush()
        return True

    def run(self, until: Callable[[], bool], limit: float = 60.0) -> None:
        """Step until ``until()`` holds; fails after ``limit`` seconds of virtual time."""
        start = self.now
        while not until():
            if not self.step():
                if until():
                    return
                raise AssertionError("the network went idle before the condition held")
            if self.now - start > limit:
                raise AssertionError(f"condition not reached within {limit} virtual seconds")
