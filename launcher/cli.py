"""Entry points only: parse the command line, compose, resolve, and hand off.

    launcher show  [overrides]            resolved config, layout, DeepSpeed JSON
    launcher plan  [overrides] [--json]   the layout table (or one JSON object)
    launcher plan  [overrides] --search   the best layouts for the model and cluster, ranked
    launcher plan  [overrides] --rank-map [--rank-map-png PATH]   node/GPU -> rank -> (tp, pp, dp)

Bad input exits with status 2 and a message naming the key, the value, the
rule and a fix; the Python traceback only with --debug (or LAUNCHER_DEBUG=1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from launcher.config.errors import ConfigError

EXIT_CONFIG_ERROR = 2


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _resolve(overrides: Sequence[str]):
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout

    cfg = compose(overrides)
    return cfg, resolve_layout(cfg)


def cmd_show(args) -> int:
    from launcher.config.compose import to_yaml
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.plan.report import plan_summary, render_plan

    cfg, layout = _resolve(args.overrides)
    con = _console()
    con.rule("resolved config")
    con.print(to_yaml(cfg), markup=False)
    con.rule("layout")
    render_plan(plan_summary(cfg, layout), con)
    con.rule("DeepSpeed config")
    con.print(json.dumps(build_deepspeed_config(cfg, layout), indent=2), markup=False)
    return 0


def cmd_plan(args) -> int:
    from launcher.plan.report import plan_summary, render_plan

    cfg, layout = _resolve(args.overrides)
    if args.search:
        return _plan_search(cfg, args)
    if args.rank_map or args.rank_map_png:
        return _rank_map(layout, args)
    summary = plan_summary(cfg, layout)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        render_plan(summary, _console())
    return 0


def _plan_search(cfg, args) -> int:
    from launcher.plan.report import render_search
    from launcher.plan.search import search_layouts, search_rows

    ranked, counts = search_layouts(cfg)
    rows = search_rows(ranked, args.top)
    if args.json:
        print(json.dumps({"counts": counts, "layouts": rows}, indent=2))
    else:
        render_search(rows, counts, _console())
    return 0


def _rank_map(layout, args) -> int:
    from launcher.plan.rankmap import format_rank_map, write_rank_map_png

    if args.rank_map:
        print(format_rank_map(layout))
    if args.rank_map_png:
        print(f"rank map written to {write_rank_map_png(layout, args.rank_map_png)}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launcher", description="Validated LLM pretraining layouts on DeepSpeed + SLURM.")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("overrides", nargs="*", help="Hydra overrides: recipe=NAME, model=NAME, key=value ...")
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.set_defaults(func=func)
        return p

    add("show", cmd_show, "print the resolved config, the derived layout and the DeepSpeed JSON")
    plan = add("plan", cmd_plan, "print the layout: world, TP/PP/DP, batch arithmetic, parameters, bubble")
    plan.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    plan.add_argument("--search", action="store_true",
                      help="enumerate every valid TP/PP/DP/ZeRO/micro-batch/recompute layout, keep what fits, rank by throughput")
    plan.add_argument("--top", type=int, default=10, help="--search: how many layouts to print (default 10)")
    plan.add_argument("--rank-map", action="store_true", help="print node/GPU -> global rank -> (tp, pp, dp), one line per rank")
    plan.add_argument("--rank-map-png", metavar="PATH", help="draw the rank map as an image (PNG)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    # Flags may sit between overrides (`plan recipe=x --json y=1`): argparse stops the positional list at a
    # flag, so the overrides after it come back as extras.
    args, extra = parser.parse_known_args(argv)
    unknown = [e for e in extra if e.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = list(args.overrides) + extra
    debug = args.debug or os.environ.get("LAUNCHER_DEBUG") == "1"
    try:
        return args.func(args)
    except BrokenPipeError:
        # `launcher plan --rank-map | head`: the reader left; that is not an error.
        sys.stdout = open(os.devnull, "w")
        return 0
    except ConfigError as err:
        if debug:
            raise
        from rich.markup import escape

        # The message holds user values (e.g. '[a, b]'): escape them so rich does not read them as markup.
        _console(stderr=True).print(f"[bold red]config error:[/bold red] {escape(str(err))}", highlight=False)
        return EXIT_CONFIG_ERROR


if __name__ == "__main__":
    sys.exit(main())
