"""A user-space Intel 82599 (ixgbe) driver, a software 82599, and a reliable frame stream.

Theory of operation
-------------------
The layers, bottom up (spec: /work/shared/specs/nicdriver.md; DESIGN.md's rules: no import
of ``capsvc.rpc`` here, and trio only in the transport's poll loop, capsvc/transport/nic.py):

- :mod:`.regs` register offsets and bits; :mod:`.pci` sysfs discovery, the allow-list and
  opening (unbind, bus mastering, BAR0 mmap); :mod:`.mmio` 32-bit register access;
  :mod:`.dma` DMA memory with physical addresses (huge pages + pagemap, or a model's
  arena); :mod:`.mempool` packet buffers named by integers; :mod:`.rings` batched RX/TX on
  descriptor rings; :mod:`.ixgbe` the device: open, the init sequence, link, statistics.
- :mod:`.model` the software 82599 (register file, RX/TX DMA engines, counters) over shared
  files; :mod:`.link` its wires (in-process cable, socket pair, AF_PACKET on veth, fault
  injection, pcap); :mod:`.modelhost` model ports on disk and the loop that runs models (a
  process or a thread); :mod:`.colocated` the mode where a port's model runs inside the
  process that drives it; :mod:`.control` the control block both sides share.
- :mod:`.segment` and :mod:`.stream` the reliable byte stream over frames (sans-I/O):
  handshake, sequence numbers, cumulative + selective acks, window, retransmission, close.
- :mod:`.cli` the ``capsvc nic`` subcommands; :mod:`.errors` typed errors that say what is
  missing and how to provide it.

Seams (spec 2.1): the driver code is the same for a real 82599 and for the model. What
differs is chosen when the device is opened, from what sysfs shows: the sysfs root, the
register accessor (plain :class:`~.mmio.Bar`, or :class:`~.mmio.ModelBar` with the
clear-on-read shim and wake-up hints, or :class:`~.colocated.ColocatedBar`) and the DMA
backend.

Quick use::

    capsvc nic start-pair demo                  # ports demo.0 and demo.1, back to back
    # in one process:  capsvc.serve("nic:model:demo.0", app)
    # in another:      capsvc.connect("nic:model:demo.1")
    capsvc nic status demo.0                    # link, counters, model events

Real hardware: ``nic:0000:03:00.0`` (after ``capsvc nic list`` shows it usable and huge
pages are reserved; run as root).

Entry points (import them from their modules; this package imports nothing, so that
parsing a ``nic:`` address stays cheap): :class:`capsvc.nicdriver.ixgbe.IxgbeDevice`,
:class:`capsvc.nicdriver.mempool.Mempool`, :class:`capsvc.nicdriver.mux.StreamMux`,
:class:`capsvc.nicdriver.stream.Channel`, :func:`capsvc.nicdriver.address.parse_nic_spec`,
:func:`capsvc.nicdriver.modelhost.start_pair`, the errors in :mod:`capsvc.nicdriver.errors`.
"""
