"""Serving benchmarks: what running capsvc for real costs (TLS first, bench/serving/tls_echo.py).

Each is a module run with ``python -m bench.serving.<name>``; servers run in processes of
their own, started and stopped by PID, on 127.0.0.1 only, as in bench/rpc.
"""
