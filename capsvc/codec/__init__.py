"""The runtime of generated codecs (``capsvc gen``): reading and building messages word by
word. ``reading`` and ``building`` hold the machinery; generated modules import from them."""

from capsvc.codec.building import MessageBuilder as MessageBuilder
from capsvc.codec.building import StructBuilder as StructBuilder
from capsvc.codec.reading import AnyPointer as AnyPointer
from capsvc.codec.reading import ListReader as ListReader
from capsvc.codec.reading import MessageReader as MessageReader
from capsvc.codec.reading import StructReader as StructReader
from capsvc.errors import DecodeError as DecodeError
