@0xccb7010bd2922120;
# Echo variants for the RPC benchmarks (bench/rpc).
#
# BenchEcho extends the plain Echo of echo.capnp, so one server object answers both the
# plain echo calls (what pycapnp's peers in tests/peers call) and the variant below.

using Echo = import "echo.capnp".Echo;

interface BenchEcho extends(Echo) {
  pingCap @0 (msg :Text) -> (reply :Text, cap :BenchEcho);
  # Returns msg unchanged plus a capability (the server itself). Because the results hold
  # a capability, the caller must send a Finish for every call (a plain echo call needs
  # none): each sequential round trip then has Finish + next Call on the client side, the
  # pattern that Nagle's algorithm plus delayed ACKs stall when they leave in two writes.
}
