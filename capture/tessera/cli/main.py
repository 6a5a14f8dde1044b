"""Entry point of `tessera-prof`. Exit status: 0 ok, 2 bad input or usage.

Each subcommand lives in its own module (`tessera.cli.<name>_cmd`, with `prepare_parser(p)` and
`run(args)`), imported only when that subcommand runs: `tessera-prof --help` or `report` must not
pay for (or fail on) plotly, pandas or torch that another subcommand needs. To add a subcommand,
add one line to `_COMMANDS`; never import a command module at the top of this file.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module under tessera.cli, one-line help shown by `tessera-prof --help`)
_COMMANDS: dict[str, tuple[str, str]] = {
    "import": ("import_cmd", "import PyTorch profiler traces into a run"),
    "import-ncu": (
        "import_ncu_cmd",
        "attach Nsight Compute counters (raw-page CSV) to a run's kernels",
    ),
    "counters": (
        "counters_cmd",
        "re-run the program under Nsight Compute and attach hardware counters to RUN",
    ),
    "report": ("report_cmd", "print a run's analyses as tables"),
    "attach": ("attach_cmd", "sample NVML counters of a running process's GPUs"),
    "pack": ("pack_cmd", "pack a run into one .tessera.zip bundle"),
    "unpack": ("unpack_cmd", "check a .tessera.zip bundle and unpack it into a run directory"),
    "html": ("html_cmd", "write a run's analyses as one offline HTML file"),
    "diff": (
        "diff_cmd",
        "compare a run against a baseline run (exit 1 with --fail-if-slower when slower)",
    ),
    "export": ("export_cmd", "export a run (OpenTelemetry: --otlp)"),
}


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser that imports its module and adds its options only when argparse
    hands it the subcommand's arguments (so only the chosen command's module is imported)."""

    command_module: str | None = None

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self.command_module is not None:
            module = importlib.import_module(f"tessera.cli.{self.command_module}")
            self.command_module = None
            self.description = module.__doc__
            module.prepare_parser(self)
            self.set_defaults(_run=module.run)
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    """The `tessera-prof` parser; subcommand modules load when their subcommand is parsed."""
    parser = argparse.ArgumentParser(
        prog="tessera-prof", description="Tessera Profiler: import, inspect and share GPU profiles."
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )
    for name, (module_name, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.command_module = module_name
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
