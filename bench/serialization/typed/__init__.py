"""The ``capsvc`` format: the benchmark cases written on ``capsvc gen``'s generated codecs.

Theory of operation
-------------------
The modules in ``bench/serialization/generated`` are what ``capsvc gen`` makes of
``schemas/bench/*.capnp`` (checked in; a test fails when they are stale). carsales,
catrank and eval here implement the case contract (base.Case) with the generated API as a
user writes it: builders and properties, no offsets. codec.py moves their messages
through the standard framing and capsvc's own packing (capsvc.codec.packing).
"""
