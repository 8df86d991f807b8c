#!/usr/bin/env python3
"""Reference-side RPC server for interop tests: pycapnp (libcapnp's C++ RPC).

Usage:
    python tests/peers/pycapnp_server.py --listen 127.0.0.1:0 --bootstrap tester|echo|calculator

Serves one bootstrap object (shared by every connection) on a TCP port. Once it
accepts connections it prints exactly one line, ``LISTENING <port>``, to stdout
and flushes it. SIGTERM or SIGINT stops it cleanly (exit status 0).

Everything else (diagnostics) goes to stderr.
"""

import argparse
import asyncio
import os
import signal
import sys

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

calc_capnp = capnp.load(os.path.join(ROOT, "schemas", "calculator.capnp"))
echo_capnp = capnp.load(os.path.join(ROOT, "schemas", "echo.capnp"))
testing_capnp = capnp.load(os.path.join(ROOT, "tests", "schemas", "testing.capnp"))

Calculator = calc_capnp.Calculator
Echo = echo_capnp.Echo
Tester = testing_capnp.Tester
Counter = testing_capnp.Counter


def log(*args):
    print("pycapnp_server:", *args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- echo


class EchoServer(Echo.Server):
    async def ping(self, msg, _context, **kwargs):
        return msg

    async def pingData(self, data, _context, **kwargs):
        return data


# ------------------------------------------------------------------------- tester


class CounterServer(Counter.Server):
    def __init__(self, start=0):
        self.value = start

    async def increment(self, by, _context, **kwargs):
        self.value += by
        return self.value

    async def get(self, _context, **kwargs):
        return self.value


# The Tester.fail kinds and the KJ exception types they name.
FAIL_KINDS = {
    "failed": "FAILED",
    "overloaded": "OVERLOADED",
    "disconnected": "DISCONNECTED",
    "unimplemented": "UNIMPLEMENTED",
}


class TesterServer(Tester.Server):
    async def echo(self, msg, _context, **kwargs):
        return msg

    async def newCounter(self, start, _context, **kwargs):
        return CounterServer(start)

    async def callBack(self, cb, value, _context, **kwargs):
        response = await cb.notify(value=value)
        return response.ack

    async def holdCaps_context(self, context):
        # Copying the struct copies every capability in it, at any depth.
        context.results.holder = context.params.holder

    async def fail(self, kind, reason, _context, **kwargs):
        kj_type = FAIL_KINDS.get(kind)
        if kj_type is None:
            raise capnp.KjException(f"unknown failure kind {kind!r}: {reason}")
        # pycapnp 2.2.4 turns ANY exception escaping a Python server method into
        # a kj::Exception of type FAILED whose description is the formatted
        # Python traceback; the `type` given here does not reach the wire.
        raise capnp.KjException(reason, type=kj_type)

    async def slow(self, ms, _context, **kwargs):
        await asyncio.sleep(ms / 1000.0)
        return True

    async def getSelf(self, _context, **kwargs):
        return self

    async def reflect(self, cap, _context, **kwargs):
        return cap

    async def callCounter(self, counter, by, _context, **kwargs):
        response = await counter.increment(by=by)
        return response.value

    async def sum(self, counters, _context, **kwargs):
        responses = await asyncio.gather(*(c.get() for c in counters))
        return sum(r.value for r in responses)


# --------------------------------------------------------------------- calculator
#
# Same semantics as the calculator-server sample shipped with Cap'n Proto:
# evaluate() returns a Value capability holding the computed number; an
# expression's previousResult is read from its Value; a call evaluates its
# params (concurrently) and then calls the function; defFunction() returns a
# Function that evaluates its body with the parameters bound; getOperator()
# returns a Function for one of the four operators.
#
# Expression structs are converted into plain Python trees straight away, so a
# defined function's body does not depend on the lifetime of the message it
# arrived in (the capabilities inside it are kept as client objects).


def parse_expression(expr):
    which = expr.which()
    if which == "literal":
        return ("literal", expr.literal)
    if which == "previousResult":
        return ("previous", expr.previousResult)
    if which == "parameter":
        return ("parameter", expr.parameter)
    if which == "call":
        return ("call", expr.call.function, [parse_expression(p) for p in expr.call.params])
    raise capnp.KjException(f"unknown expression kind {which!r}")


async def evaluate_tree(tree, params=()):
    kind = tree[0]
    if kind == "literal":
        return tree[1]
    if kind == "previous":
        return (await tree[1].read()).value
    if kind == "parameter":
        index = tree[1]
        if index >= len(params):
            raise capnp.KjException("Parameter index out-of-range.")
        return params[index]
    if kind == "call":
        _, func, arg_trees = tree
        args = await asyncio.gather(*(evaluate_tree(t, params) for t in arg_trees))
        return (await func.call(params=list(args))).value
    raise capnp.KjException(f"bad expression tree {kind!r}")


class ValueServer(Calculator.Value.Server):
    def __init__(self, value):
        self.value = value

    async def read(self, _context, **kwargs):
        return self.value


class DefinedFunction(Calculator.Function.Server):
    def __init__(self, param_count, body_tree):
        self.param_count = param_count
        self.body = body_tree

    async def call(self, params, _context, **kwargs):
        if len(params) != self.param_count:
            raise capnp.KjException("Wrong number of parameters.")
        return await evaluate_tree(self.body, list(params))


class OperatorFunction(Calculator.Function.Server):
    def __init__(self, op):
        self.op = op

    async def call(self, params, _context, **kwargs):
        if len(params) != 2:
            raise capnp.KjException("Wrong number of parameters.")
        a, b = params[0], params[1]
        if self.op == "add":
            return a + b
        if self.op == "subtract":
            return a - b
        if self.op == "multiply":
            return a * b
        if self.op == "divide":
            return a / b
        raise capnp.KjException(f"Unknown operator {self.op!r}.")


class CalculatorServer(Calculator.Server):
    async def evaluate(self, expression, _context, **kwargs):
        return ValueServer(await evaluate_tree(parse_expression(expression)))

    async def defFunction(self, paramCount, body, _context, **kwargs):
        return DefinedFunction(paramCount, parse_expression(body))

    async def getOperator(self, op, _context, **kwargs):
        return OperatorFunction(str(op))


BOOTSTRAPS = {
    "tester": TesterServer,
    "echo": EchoServer,
    "calculator": CalculatorServer,
}


# ------------------------------------------------------------------------- main


def parse_listen(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def serve(host, port, bootstrap):
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def on_connection(stream):
        try:
            await capnp.TwoPartyServer(stream, bootstrap=bootstrap).on_disconnect()
        except Exception as exc:  # one broken connection must not stop the server
            log(f"connection ended with {type(exc).__name__}: {exc}")

    server = await capnp.AsyncIoStream.create_server(on_connection, host, port)
    bound_port = server.sockets[0].getsockname()[1]
    print(f"LISTENING {bound_port}", flush=True)
    async with server:
        await stop.wait()
    log("stopping")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--listen", type=parse_listen, default=("127.0.0.1", 0), metavar="HOST:PORT"
    )
    parser.add_argument("--bootstrap", choices=sorted(BOOTSTRAPS), required=True)
    args = parser.parse_args()
    host, port = args.listen
    asyncio.run(capnp.run(serve(host, port, BOOTSTRAPS[args.bootstrap]())))


if __name__ == "__main__":
    main()
