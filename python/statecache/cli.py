"""``statecache demo | simulate | bench | info``.

Each subcommand is a module with ``register(subparsers) -> parser`` and
``run(args) -> int``; ``_SUBCOMMANDS`` names where each lives, so an area
adds its command by providing that module, without editing this file's logic.
"""

from __future__ import annotations

import argparse
import importlib
import sys

_SUBCOMMANDS = {
    "demo": "statecache.demo",
    "simulate": "statecache.sim.cli",
    "bench": "statecache.bench",
    "info": "statecache.info",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="statecache", description="Prefix-cache checkpoints for the recurrent state of hybrid LLMs."
    )
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(_SUBCOMMANDS) + "}")
    sub.required = True
    for name, module in _SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing = sub.add_parser(name, help=f"(unavailable: {e})")
            missing.set_defaults(func=lambda _a, e=e, n=name: _unavailable(n, e))
            continue
        p = mod.register(sub)
        p.set_defaults(func=mod.run)
    return parser


def _unavailable(name: str, err: Exception) -> int:
    print(f"statecache {name}: not available in this installation ({err})", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
