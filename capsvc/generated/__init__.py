"""Generated modules (``capsvc gen``) of capsvc's own schemas, in ``schemas/``.

- ``calculator_capnp``: the calculator of Cap'n Proto's C++ samples (capsvc.demo);
- ``echo_capnp`` and ``bench_echo_capnp``: the echo services of the RPC benchmarks;
- ``health_capnp``: the health interface served beside an application's bootstrap
  (capsvc.health).

Do not edit them: change the schema and regenerate (tests/interop/test_generated_stubs.py
fails when they are stale)::

    capsvc gen schemas/calculator.capnp schemas/echo.capnp schemas/bench_echo.capnp \
        schemas/health.capnp -o capsvc/generated
"""
