"""Entry point of `tessera-prof`. Exit status: 0 ok, 2 bad input or usage."""

from __future__ import annotations

import argparse
import sys

from tessera.cli import (
    attach_cmd,
    counters_cmd,
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
    "counters": counters_cmd,
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
    argv = sys.argv[1:] if argv is None else list(argv)
    # Everything after the first `--` is a program to run (`tessera-prof counters RUN --
    # python train.py --lr 3e-4`), kept verbatim: argparse would read its options as ours.
    program = None
    if "--" in argv:
        cut = argv.index("--")
        argv, program = argv[:cut], argv[cut + 1 :]
    if argv and argv[0].split("=", 1)[0] == "--pid":
        argv = ["attach", *argv]  # the short form: `tessera-prof --pid PID ...`
    parser = build_parser()
    args = parser.parse_args(argv)
    if program is not None:
        if not hasattr(args, "program"):
            parser.error(f"{args.command} takes no program after --")
        args.program = program
    return args._run(args)


if __name__ == "__main__":
    sys.exit(main())
