"""Entry point of `tessera-prof`. Exit status: 0 ok, 2 bad input or usage."""

from __future__ import annotations

import argparse
import sys

from tessera.cli import (
    attach_cmd,
    diff_cmd,
    html_cmd,
    import_cmd,
    import_ncu_cmd,
    pack_cmd,
    report_cmd,
    unpack_cmd,
)

_COMMANDS = {
    "import": import_cmd,
    "import-ncu": import_ncu_cmd,
    "report": report_cmd,
    "attach": attach_cmd,
    "pack": pack_cmd,
    "unpack": unpack_cmd,
    "html": html_cmd,
    "diff": diff_cmd,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera-prof", description="Tessera Profiler: import, inspect and share GPU profiles."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in _COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.prepare_parser(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args._run(args)


if __name__ == "__main__":
    sys.exit(main())
