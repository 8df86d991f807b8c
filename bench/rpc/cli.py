"""Command line of the RPC benchmarks: ``python -m bench.rpc COMMAND``.

Theory of operation: a thin argparse layer over the modules that do the work.

    run      the whole RPC suite (or ``--only`` some scenarios), then the report
    smoke    the same, tiny (a few seconds): every pairing, load and Nagle case
    list     the scenarios and their ids
    report   Markdown table + PNG charts from a results directory
    profile  where the time of one capsvc call goes (CPU, scheduler passes, writes)
    server   one benchmark server (internal: started by ``run``)
    nagle-client  one Nagle case's client (internal: started by ``run``)
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import sys

from bench.rpc import scenarios


def _run(args: argparse.Namespace) -> int:
    from bench.rpc import driver

    if args.only:
        unknown = scenarios.unknown_patterns(args.only)
        if unknown:
            print(f"no scenario matches {unknown}; see `python -m bench.rpc list`")
            return 2
    loads = args.loads.split(",") if args.loads else None
    if loads and (bad := [n for n in loads if n not in scenarios.LOADS]):
        print(f"unknown loads {bad}; known: {', '.join(scenarios.LOADS)}")
        return 2
    smoke = args.command == "smoke"
    only = args.only or (list(scenarios.SMOKE) if smoke and not loads else None)
    chosen = [] if args.nagle_only else scenarios.select(only, loads)
    pyperf_args = shlex.split(args.pyperf) if args.pyperf else None
    config = driver.RunConfig(
        out=args.out or driver.default_out_dir(smoke),
        scenarios=chosen,
        reps=args.reps if args.reps else (1 if smoke else 3),
        pyperf_args=pyperf_args or list(driver.SMOKE_PYPERF if smoke else driver.FULL_PYPERF),
        nagle=not args.no_nagle and (not args.only or args.nagle_only),
        smoke=smoke,
        ablation_seconds=args.ablation_seconds or (0.5 if smoke else 21.0),
        quiet=args.quiet,
    )
    if not config.scenarios and not config.nagle:
        print("nothing to run")
        return 2
    driver.run(config)
    if not args.no_report:
        from bench.rpc import report

        report.main_report(config.out, config.out, charts_too=not args.no_charts, quiet=args.quiet)
    return 0


def _list(args: argparse.Namespace) -> int:
    for scenario in scenarios.select(["*"], list(scenarios.LOADS)):
        default = scenario.load.name in scenarios.DEFAULT_LOADS
        print(f"{scenario.id:32} {scenario.pairing.title}{'' if default else '  (not in run)'}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from bench.rpc import report

    results = args.results or _latest_results()
    if results is None:
        print("no results found; run `python -m bench.rpc run` first")
        return 2
    report.main_report(
        results, args.out or results, charts_too=not args.no_charts, readme=args.readme
    )
    return 0


def _latest_results() -> str | None:
    found = [
        d
        for d in glob.glob(os.path.join(scenarios.RESULTS_ROOT, "rpc", "*"))
        if os.path.isfile(os.path.join(d, "manifest.json"))
    ]
    return max(found, key=os.path.getmtime) if found else None


def _server(args: argparse.Namespace) -> int:
    from bench.rpc import servers

    if args.impl == "capsvc":
        servers.run_capsvc_server(
            args.listen,
            nodelay=not args.no_nodelay,
            coalesce=not args.no_coalesce,
            busy_poll=not args.no_busy_poll,
            dynamic=args.dynamic,
            async_methods=args.async_methods,
        )
    else:
        servers.run_raw_server(args.listen, busy_poll=not args.no_busy_poll)
    return 0


def _nagle_client(args: argparse.Namespace) -> int:
    from bench.rpc import nagle

    nagle.client_main(
        args.connect, args.method, args.calls, args.max_seconds, args.warmup,
        nodelay=not args.no_nodelay, coalesce=not args.no_coalesce, out=args.out,
        pause=args.pause,
    )  # fmt: skip
    return 0


def _profile(args: argparse.Namespace) -> int:
    from bench.rpc import profile

    return profile.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.rpc", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "smoke"):
        p = sub.add_parser(name, help="run the suite" if name == "run" else "tiny run, for CI")
        p.add_argument(
            "--only",
            action="append",
            metavar="PATTERN",
            help="scenario ids (fnmatch patterns: capsvc-tcp/*, */c12-16B); repeatable",
        )
        p.add_argument("--loads", help=f"comma-separated loads ({', '.join(scenarios.LOADS)})")
        p.add_argument("--reps", type=int, help="repetitions (default 3; smoke 1)")
        p.add_argument("--out", help="results directory (default bench/results/rpc/<time>)")
        p.add_argument("--pyperf", help="pyperf options replacing the defaults, one string")
        p.add_argument("--no-nagle", action="store_true", help="skip the Nagle experiment")
        p.add_argument("--nagle-only", action="store_true", help="only the Nagle experiment")
        p.add_argument(
            "--ablation-seconds",
            type=float,
            help="time budget of the Nagle ablation over all reps (default 21)",
        )
        p.add_argument("--no-report", action="store_true")
        p.add_argument("--no-charts", action="store_true")
        p.add_argument("--quiet", "-q", action="store_true")
        p.set_defaults(func=_run)
    p = sub.add_parser("list", help="list scenario ids")
    p.set_defaults(func=_list)
    p = sub.add_parser("report", help="Markdown + PNG report of a results directory")
    p.add_argument("results", nargs="?", help="results directory (default: the latest)")
    p.add_argument("--out", help="where report.md and the PNGs go (default: RESULTS)")
    p.add_argument("--readme", help="also replace the results section of this README")
    p.add_argument("--no-charts", action="store_true")
    p.set_defaults(func=_report)
    p = sub.add_parser("profile", help="per-call costs of capsvc, client and server side")
    from bench.rpc.profile import add_arguments

    add_arguments(p)
    p.set_defaults(func=_profile)
    p = sub.add_parser("server", help="(internal) one benchmark server")
    p.add_argument("impl", choices=["capsvc", "raw"])
    p.add_argument("--listen", default="tcp:127.0.0.1:0")
    p.add_argument("--no-nodelay", action="store_true")
    p.add_argument("--no-coalesce", action="store_true")
    p.add_argument(
        "--no-busy-poll",
        action="store_true",
        help="sleep until readable (capsvc: busy_poll=None; raw: no fixed-budget polling)",
    )
    p.add_argument("--dynamic", action="store_true", help="capsvc: the dynamic path")
    p.add_argument(
        "--async-methods", action="store_true", help="capsvc: async def methods (as pycapnp's)"
    )
    p.set_defaults(func=_server)
    p = sub.add_parser("nagle-client", help="(internal) one Nagle case's client")
    p.add_argument("--connect", required=True)
    p.add_argument("--method", choices=["ping", "pingCap"], default="pingCap")
    p.add_argument("--calls", type=int, required=True)
    p.add_argument("--max-seconds", type=float, required=True)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--no-nodelay", action="store_true")
    p.add_argument("--no-coalesce", action="store_true")
    p.add_argument("--pause", type=float, default=0.0, help="seconds between calls")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_nagle_client)
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
