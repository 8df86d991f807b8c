"""RPC benchmarks."""
