"""Copying a payload into a new Call or Return message, capabilities included.

Theory of operation: forwarding a call (a promise that resolved back to the peer, a proxy to
another connection) or returning results that came from elsewhere needs the content in a new
message. pycapnp copies content, but refuses capability pointers outside its RPC system
(pycapnp-notes.md §1.4). So: find every capability pointer (``pointers.scan_caps``), copy the
segments with those words zeroed, let pycapnp copy the now capability-free content, and record
the same hooks at the same paths in the new payload.
"""

from __future__ import annotations

from collections.abc import Sequence

from capsvc.errors import Failed
from capsvc.rpc import pointers, wire
from capsvc.rpc.hooks import BrokenHook, Hook
from capsvc.rpc.payload import BuiltPayload, CodecPayload, Payload, ReceivedPayload

_ZERO_WORD = bytes(8)


def copy_to_call(source: Payload, target: BuiltPayload) -> BuiltPayload:
    """Copy ``source`` into ``target`` (an empty Call payload) and return ``target``."""
    _copy(source, target)
    return target


def copy_to_return(source: Payload, target: BuiltPayload) -> BuiltPayload:
    """Copy ``source`` into ``target`` (an empty Return payload) and return ``target``."""
    _copy(source, target)
    return target


def _copy(source: Payload, target: BuiltPayload) -> None:
    inner = getattr(source, "shared_inner", None)
    if inner is not None:
        source = inner
    if isinstance(source, BuiltPayload):
        if source.payload_builder._has("content"):
            target.payload_builder.content = source.payload_builder.content
        for path, index in source.cap_paths.items():
            hook = source.caps[index]
            target.set_cap(path, hook.add_ref() if hook is not None else None)
        return
    if not isinstance(source, ReceivedPayload | CodecPayload):
        raise TypeError(f"cannot copy {type(source).__name__}")
    if isinstance(source, ReceivedPayload) and not source.caps:
        if source.payload_reader._has("content"):
            target.payload_builder.content = source.payload_reader.content
        return
    # As raw segments (received, or built by generated codecs: the same rpc.capnp layout):
    # zero the capability words, let pycapnp copy the rest, put the hooks back by path.
    view, start, caps = source.codec_view()
    if start is None:
        return
    segments = [bytearray(s) for s in view]
    found = pointers.scan_caps(segments, start)
    for _, (segment, word), _ in found:
        segments[segment][word * 8 : word * 8 + 8] = _ZERO_WORD
    message = wire.Message.from_segments(segments)
    reader = (
        message.call.params
        if source.content_path == wire.CALL_CONTENT_PATH
        else getattr(message, "return").results
    )
    if reader._has("content"):
        target.payload_builder.content = reader.content
    for path, _, index in found:
        target.set_cap(path, _hook_at(caps, index))


def _hook_at(caps: Sequence[Hook | None], index: int) -> Hook | None:
    if index >= len(caps):
        return BrokenHook(Failed(f"capability index {index} is outside the capTable"))
    hook = caps[index]
    return hook.add_ref() if hook is not None else None
