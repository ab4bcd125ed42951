"""The `rhino` command: parse | plan | pipeline | run | solve | sweep."""

from __future__ import annotations

import click

from rhino.cli.common import print_version
from rhino.cli.parse_cmd import parse_command
from rhino.cli.pipeline_cmd import pipeline_command
from rhino.cli.plan_cmd import plan_command
from rhino.cli.run_cmd import run_command
from rhino.cli.solve_cmd import solve_command
from rhino.cli.sweep_cmd import sweep_command
from rhino.hlo.errors import EXIT_CODES

EPILOG = "\b\nExit codes, the same for every command:\n" + "\n".join(
    f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items()
)


@click.group(
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

    \b
    Examples:
      rhino parse examples/gpt_tiny.hlo
      rhino plan model.hlo --mesh 2x8 --opt O2
      rhino pipeline examples/gpt_tiny.hlo --stages 4
      rhino run model.hlo --plan plan.json
      rhino sweep configs/sweeps/examples.yaml
      rhino solve asplos-2025-iopddl-A.json.gz --time-limit 60
    """


cli.add_command(parse_command)
cli.add_command(plan_command)
cli.add_command(pipeline_command)
cli.add_command(run_command)
cli.add_command(solve_command)
cli.add_command(sweep_command)


def main() -> None:
    cli(prog_name="rhino")


if __name__ == "__main__":
    main()
