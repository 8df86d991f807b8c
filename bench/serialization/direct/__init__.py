"""Cap'n Proto through the suite's own accessors: struct formats at precomputed offsets.

Theory of operation
-------------------
wire.py holds the encoding pieces (pointers, far pointers, layout checks against the
pycapnp schemas, framing, libcapnp packing); carsales, catrank and eval implement the
benchmark contract (base.Case) on ``list[bytes]`` messages. They are valid Cap'n Proto
messages (laid out differently from libcapnp's): pycapnp reads what these write and the
other way round, multi-segment messages and far pointers included (tests/bench).
"""
