@0xf8d97418aec63f5e;
# The echo service used by the RPC benchmarks and the interop tests.

interface Echo {
  ping @0 (msg :Text) -> (reply :Text);
  # Returns msg unchanged.

  pingData @1 (data :Data) -> (data :Data);
  # Returns data unchanged (for payload-size runs).
}
