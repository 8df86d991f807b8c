"""The echo RPC benchmarks: capsvc vs pycapnp's RPC vs a raw trio ping-pong, and Nagle.

Theory of operation
-------------------
``python -m bench.rpc run`` (bench.rpc.driver) runs every scenario (bench.rpc.scenarios:
a pairing of client implementation and server process, times a load) in repetitions,
rep-major, then writes the report (bench.rpc.report). The design choices:

- **Servers in their own processes, clients in pyperf's worker processes**, like
  capnp-rpc's echo_bench: client and server never share an interpreter, a GIL or an
  event loop, and each server is fresh per repetition (bench.rpc.servers).
- **pyperf's Runner times the calls** (bench.rpc.suite): per pairing and repetition a
  Runner master calls ``bench_time_func`` per load; pyperf spawns the workers,
  calibrates the loops, runs warm-ups and values, and gets the server address through
  ``add_cmdline_args``. The value is seconds per call, so calls/s is 1 / mean and
  ``pyperf compare_to`` compares implementations directly (same benchmark names in
  every pairing's file). We chose ``bench_time_func`` over ``bench_async_func`` because
  one client must keep one connection for the whole worker (bench.rpc.clients runs its
  event loop in a thread and times the calls inside it), and over hand-made loops
  because pyperf then owns the statistics, the metadata and the file format.
- **Latencies are pyperf values as well**: a throughput value is a mean, which hides the
  tail, so each worker also records every call's latency during the timed values and
  the master stores them with pyperf's Run API as ``echo-<load>-latency`` (one value per
  call), so that ``pyperf stats`` / ``hist`` show the distribution and the report takes
  p50 … max from it. The Nagle experiment (bench.rpc.nagle) is only per-call latencies
  and counts of stalls over a fixed number of sequential calls, so it uses the Run API
  alone.
- **Every figure per repetition first, then median and range** (bench.rpc.results), and
  ratios within a repetition: the machines are shared and noisy.

``python -m bench.rpc profile`` (bench.rpc.profile) and ``python -m bench.rpc.experiments``
explain the figures: per-call costs per side, system calls, profilers, and what-if
patches.
"""
