"""The serialization suite: carsales, catrank and eval (specs/benchmarks.md) on pyperf.

Theory of operation
-------------------
Each benchmark module (carsales, catrank, eval) holds its input generator and its
pycapnp and msgpack cases; direct/ holds the same three on raw segments. codecs turns
messages into bytes, modes and pipe run the four modes, server is the pipe modes' other
process, cli drives pyperf and report renders its results. See bench/README.md.
"""
