"""The example's server, written on the generated bases (kv_capnp.py).

Serve it with ``./dev capsvc serve examples.kv.server:Directory --listen tcp:127.0.0.1:5000``.
"""

from __future__ import annotations

import capsvc
from capsvc.generated.stream_capnp import StreamResult

from . import kv_capnp as kv


class Store(kv.Store.Server):
    """One named store: a dict, and the watchers to call after each put."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.watchers: list[kv.Watcher.Client] = []

    # A plain ``def`` runs at once when the call arrives (use it for quick methods)...
    def get(self, params: kv.Store.GetParams.Reader, results: kv.Store.GetResults.Builder) -> None:
        value = self.data.get(params.key)
        results.found = value is not None
        results.value = value or b""

    # ...an ``async def`` runs as its own trio task, and may await other calls.
    async def put(
        self, params: kv.Store.PutParams.Reader, results: kv.Store.PutResults.Builder
    ) -> None:
        key, value = params.key, params.value
        results.replaced = key in self.data
        self.data[key] = value
        for watcher in list(self.watchers):
            try:
                await watcher.changed(key=key, value=value)
            except capsvc.RpcError:  # gone or broken: stop calling it
                self.watchers.remove(watcher)

    def keys(
        self, params: kv.Store.KeysParams.Reader, results: kv.Store.KeysResults.Builder
    ) -> None:
        results.keys = sorted(self.data)

    def watch(
        self, params: kv.Store.WatchParams.Reader, results: kv.Store.WatchResults.Builder
    ) -> None:
        self.watchers.append(params.watcher)  # a typed Watcher.Client, kept past the call

    # A ``-> stream`` method: capsvc runs one at a time per store, in order.
    def load(self, params: kv.Store.LoadParams.Reader, results: StreamResult.Builder) -> None:
        self.data[params.key] = params.value


class Directory(kv.Directory.Server):
    """The bootstrap object: hands out stores by name."""

    def __init__(self) -> None:
        self.stores: dict[str, Store] = {}

    def open(
        self, params: kv.Directory.OpenParams.Reader, results: kv.Directory.OpenResults.Builder
    ) -> None:
        results.store = self.stores.setdefault(params.name, Store())
