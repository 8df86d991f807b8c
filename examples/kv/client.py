"""The example's client: ``./dev python -m examples.kv.client tcp:127.0.0.1:5000``."""

from __future__ import annotations

import sys

import trio

import capsvc

from . import kv_capnp as kv


class PrintingWatcher(kv.Watcher.Server):
    """Our own object, passed to the server, which calls it back."""

    def changed(
        self, params: kv.Watcher.ChangedParams.Reader, results: kv.Watcher.ChangedResults.Builder
    ) -> None:
        print(f"watcher: {params.key} = {params.value!r}")


async def main(address: str) -> None:
    async with capsvc.connect(address) as conn:
        directory = conn.bootstrap(kv.Directory)  # a kv.Directory.Client
        users = directory.open(name="users").store  # pipelined: usable before open returns
        await users.watch(watcher=PrintingWatcher())
        await users.put(key="ada", value=b"Lovelace")
        replaced = (await users.put(key="ada", value=b"King")).replaced
        found = await users.get(key="ada")
        print(f"replaced={replaced} found={found.found} value={found.value!r}")
        print("keys:", list((await users.keys()).keys))
        for n in range(1000):  # a stream: each await returns at once while the window has room
            await users.load(key=f"user{n:03}", value=b"x" * 100)
        keys = (await users.keys()).keys  # (a load that failed would fail this call too)
        print("after the load:", len(keys), "keys, the last", keys[-1])


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "tcp:127.0.0.1:5000")
