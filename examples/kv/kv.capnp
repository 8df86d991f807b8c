@0xd1e0c3b5a7f29e41;
# The README's example service: named key-value stores, and watchers called back on change.

interface Directory {
  open @0 (name :Text) -> (store :Store);
  # The store called `name` (made on first use).
}

interface Store {
  get @0 (key :Text) -> (value :Data, found :Bool);
  put @1 (key :Text, value :Data) -> (replaced :Bool);
  keys @2 () -> (keys :List(Text));
  watch @3 (watcher :Watcher) -> ();
  # Calls `watcher.changed` after every put, until the watcher fails.
  load @4 (key :Text, value :Data) -> stream;
  # A bulk put: a stream, so a caller sends many without a round trip each (watchers are
  # not called).
}

interface Watcher {
  changed @0 (key :Text, value :Data) -> ();
}
