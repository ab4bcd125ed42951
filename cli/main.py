"""The `rhino` command: parse | plan | pipeline | run | solve | sweep.

Each command's module is imported when the command runs, not before: `rhino --help`
and `rhino parse` do not pay for the solvers, jax or matplotlib."""

from __future__ import annotations

import gc
import importlib

import click

from rhino.cli.common import print_version
from rhino.hlo.errors import EXIT_CODES

COMMANDS = {
    "parse": (
        "rhino.cli.parse_cmd",
        "parse_command",
        "Summarize an HLO module: instructions, FLOPs, loops.",
    ),
    "pipeline": (
        "rhino.cli.pipeline_cmd",
        "pipeline_command",
        "Split a training step into pipeline stages.",
    ),
    "plan": (
        "rhino.cli.plan_cmd",
        "plan_command",
        "Find the SPMD sharding plan for a device mesh.",
    ),
    "run": (
        "rhino.cli.run_cmd",
        "run_command",
        "Run a plan through XLA: verify it, measure it.",
    ),
    "solve": (
        "rhino.cli.solve_cmd",
        "solve_command",
        "Solve an IOPDDL problem (a strategy per node).",
    ),
    "sweep": (
        "rhino.cli.sweep_cmd",
        "sweep_command",
        "Plan every entry of sweep files, in parallel.",
    ),
}
"""Command name -> (module, attribute, the line `rhino --help` shows for it)."""


class _LazyGroup(click.Group):
    """A group whose commands are imported when one is run (or asked for its help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][2]) for name in sorted(COMMANDS)])


EPILOG = "\b\nExit codes, the same for every command:\n" + "\n".join(
    f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items()
)


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EPILOG,
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=print_version,
    help="Show rhino's version and the jax, jaxlib and Python it runs on, and exit.",
)
def cli() -> None:
    """rhino: make a single-device XLA HLO training step run well on many devices.

    A command's FILE is the step as HLO or StableHLO text (what `lower(...).as_text()`
    prints, with or without dialect="hlo"), a serialized HloModuleProto, or an XLA
    dump folder (XLA_FLAGS=--xla_dump_to=DIR; --module picks one of its modules).

    \b
    Examples:
      rhino parse examples/gpt_tiny.hlo
      rhino plan model.hlo --mesh 2x8 --opt O2
      rhino pipeline examples/gpt_tiny.hlo --stages 4
      rhino run model.hlo --plan plan.json
      rhino sweep configs/sweeps/examples.yaml
      rhino solve asplos-2025-iopddl-A.json.gz --time-limit 60
    """


def main() -> None:
    try:
        cli(prog_name="rhino")
    finally:
        # what the command built is garbage now, freed as the process ends: frozen, the
        # collection at exit skips walking it (rhino parse of the 72-layer GPT: 0.13 s)
        gc.freeze()


if __name__ == "__main__":
    main()
