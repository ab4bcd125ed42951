"""What every rhino command shares: options, error handling, output helpers."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from rhino.cli import flags
from rhino.hlo.errors import ConfigError, HloParseError, RhinoError

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from rhino.runtime.sources import Loaded

    stdout: Console
    stderr: Console

F = TypeVar("F", bound=Callable[..., Any])

JSON_SCHEMA_VERSION = 1

PIPE_WIDTH = 10_000
"""Columns of a console that is a pipe or a file: wide enough that no table is cut and no
line folded (a terminal keeps its own width)."""


@functools.cache
def _console_class() -> type[Console]:
    """A rich console whose width off a terminal is PIPE_WIDTH, not rich's 80: tables in
    a pipe keep every name whole, and each message is one line for grep."""
    from rich.console import Console, ConsoleDimensions

    class _Console(Console):
        @property
        def size(self) -> ConsoleDimensions:
            size = super().size
            return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

        @size.setter
        def size(self, new_size: tuple[int, int]) -> None:
            Console.size.fset(self, new_size)  # type: ignore[attr-defined]

        def on_broken_pipe(self) -> None:
            """Rich would exit 1 here; see `reader_gone`."""
            reader_gone()

    return _Console


def reader_gone() -> None:
    """The reader of stdout went away (`rhino ... | head`): it has what it wanted, so stop
    quietly with 141, as SIGPIPE would; stdout goes to /dev/null first, or Python would
    complain again when it flushes stdout at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(141)


def __getattr__(name: str) -> Console:
    """`stdout` and `stderr`, rich consoles made at their first use: a command that prints
    only JSON imports no rich (`rich.console`, 45-60 ms, was a tenth of `rhino parse
    --json`)."""
    if name == "stdout":
        made = _console_class()(highlight=False, soft_wrap=False)
    elif name == "stderr":
        made = _console_class()(stderr=True, highlight=False)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = made
    return made


def _stderr() -> Console:
    """`stderr`, from within this module (where a name is not looked up in `__getattr__`)."""
    found = globals().get("stderr")
    return found if found is not None else __getattr__("stderr")


SECONDS = click.FloatRange(min=0, min_open=True)
"""A time limit: a positive number of seconds."""


def mesh_option(help: str) -> Callable[[F], F]:
    """--mesh, as `rhino plan`, `pipeline` and `run` take it (parsed by search.mesh)."""
    return click.option("--mesh", "mesh_text", metavar="AxB", help=help)


def cluster_option(help: str = "Cluster name (configs/clusters) or YAML file.") -> Callable[[F], F]:
    """--cluster: a cluster name from configs/clusters or a YAML file; m8 by default."""
    return click.option("--cluster", default="m8", show_default=True, help=help)


def opt_option(help: str) -> Callable[[F], F]:
    """--opt: the search level, one of LEVELS."""
    from rhino.search.spmd.plan import LEVELS

    return click.option(
        "--opt", "level", default="O2", show_default=True, type=click.Choice(LEVELS), help=help
    )


def gantt_option(help: str) -> Callable[[F], F]:
    """--gantt FILE: a picture of a schedule's timeline (its folder checked up front)."""
    return click.option(
        "--gantt",
        type=click.Path(dir_okay=False, writable=True),
        callback=prepare_output,
        help=help,
    )


def job_options(fn: F) -> F:
    """--coordinator, --num-processes and --process-id: this process's place in a job of
    several (`rhino run`); they go together. --address and --join-timeout tune it."""
    fn = click.option(
        "--join-timeout",
        type=click.IntRange(min=1),
        default=60,
        show_default=True,
        help="Seconds to wait for the coordinator and every process of the job.",
    )(fn)
    fn = click.option(
        "--address",
        metavar="HOST[:PORT]",
        help="This host's address as the other processes reach it (its collectives, and a "
        "stage plan's transfer server at PORT) [default: the address this machine reaches "
        "the coordinator from; PORT: the coordinator's + 1 + process id].",
    )(fn)
    fn = click.option(
        "--process-id", type=int, help="This process's index in the job, 0..num-processes-1."
    )(fn)
    fn = click.option(
        "--num-processes", type=int, help="Processes in the job (with --coordinator)."
    )(fn)
    return click.option(
        "--coordinator",
        metavar="HOST:PORT",
        help="Run as one process of a job of several (one per host): process 0 serves here.",
    )(fn)


def input_argument(fn: F) -> F:
    """FILE, the training step every command reads (`rhino.runtime.sources.load`), and
    --module, which picks one module of an XLA dump folder."""
    fn = click.option(
        "--module",
        "module_name",
        metavar="NAME",
        help="In an XLA dump folder: the module to read, by name (jit_step), number or "
        "file name [default: the one with the most dot/convolution instructions].",
    )(fn)
    return click.argument("file", type=click.Path(allow_dash=True))(fn)


def load_input(file: str, module_name: str | None, *, lazy: bool = True) -> Loaded:
    """The step in `file` (HLO or StableHLO text, an HloModuleProto, an XLA dump folder),
    with the loader's notes (a dump's pick, dropped shardings) on stderr."""
    from rhino.runtime.sources import load

    loaded = load(file, module=module_name, lazy=lazy)
    for note in loaded.notes:
        _stderr().print(f"note: {flags.in_flags(note)}", markup=False, highlight=False)
    return loaded


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout."
)
debug_option = click.option("--debug", is_flag=True, help="Show Python tracebacks for errors.")


def handle_errors(fn: F) -> F:
    """Turn RhinoError into `error: ...` on stderr and its exit code (2, or 1 for failed checks).

    With --debug the traceback is shown instead. Any other exception is a bug in rhino:
    it is reported as such, with exit code 3 (the traceback with --debug).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = kwargs.get("debug", False)
        if not debug:
            from rhino.runtime.environment import quiet_native_logs

            quiet_native_logs()
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a reader that went away shows here, not at exit
            return result
        except BrokenPipeError:
            reader_gone()
        except RhinoError as e:
            if debug:
                raise
            # plain text, never wrapped: paths and carets must stay intact
            text = flags.shown(e)
            message = text if isinstance(e, HloParseError) else f"error: {text}"
            click.echo(message, err=True)
            _exit(e.exit_code)
        except KeyboardInterrupt:
            _stderr().print("interrupted")
            _exit(130)
        except Exception as e:  # a bug in rhino, not bad input
            if debug:
                raise
            click.echo(
                f"internal error: {type(e).__name__}: {e}\n"
                "This is a bug in rhino; rerun with --debug for the traceback.",
                err=True,
            )
            _exit(3)

    return wrapper  # type: ignore[return-value]


def _exit(code: int) -> NoReturn:
    """sys.exit, or at once (`os._exit`) in a process that left a job of several on a
    failure (`rhino.runtime.xla_bridge.leave_if_abandoned`)."""
    if "jax" in sys.modules:
        from rhino.runtime.xla_bridge import leave_if_abandoned

        leave_if_abandoned(code)
    sys.exit(code)


def print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """`rhino --version`: rhino, the jax and jaxlib it runs on (and their backend plugins),
    Python; with a warning when that jax is outside the tested range."""
    if not value or ctx.resilient_parsing:
        return
    from rhino.runtime import environment

    found = environment.versions()
    click.echo(f"rhino {found['rhino']}")
    click.echo(f"jax {found['jax']}, jaxlib {found['jaxlib']}, Python {found['python']}")
    for name, version in environment.jax_plugins().items():
        click.echo(f"plugin {name} {version}")
    low, high = environment.SUPPORTED_JAX
    click.echo(f"tested with jax {low} to {high}")
    if reason := environment.untested_jax(found):
        click.echo(f"warning: {reason}", err=True)
    ctx.exit()


def prepare_output(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback of an output file option: checked before any work is done. Its
    folder is created when missing; a path whose folder cannot be made or written is
    refused (exit 2) instead of failing after the work. (A path that is a folder the
    option's `click.Path(dir_okay=False)` refuses before this runs.)"""
    if value is None or value == "-":
        return value
    flag = f"--{(param.name or 'out').replace('_', '-')}"
    path = Path(value)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise click.BadParameter(
            f"cannot create the folder {path.parent} for {value}: {e.strerror or e}",
            param_hint=flag,
        ) from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise click.BadParameter(f"{value} cannot be written (permission denied)", param_hint=flag)
    return value


def save_output(path: str, text: str, what: str) -> None:
    """Write `text` (the finished `what`) to `path`. When that fails anyway (the disk
    filled, the folder went away), the work is not lost: it goes to a temporary file,
    and the error (exit 2) names both."""
    try:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as e:
        kept = tempfile.NamedTemporaryFile(
            "w", prefix="rhino-", suffix=f"-{Path(path).name}", delete=False, encoding="utf-8"
        )
        with kept:
            kept.write(text)
        raise ConfigError(
            f"cannot write the {what} to {path}: {e.strerror or e}; it is saved in {kept.name}"
        ) from None


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def emit_json(command: str, payload: dict[str, Any]) -> None:
    """Print `{"schema": "rhino.<command>/<version>", "versions": {...}, ...payload}` on
    stdout; "versions" names the rhino, jax, jaxlib and Python that produced it."""
    from rhino.hlo.jsonable import jsonable
    from rhino.runtime.environment import versions

    doc = {
        "schema": f"rhino.{command}/{JSON_SCHEMA_VERSION}",
        "versions": versions(),
        **jsonable(payload),
    }
    # indented for a person at a terminal; one line for a pipe (a 40k-instruction plan is
    # 15 MB indented, and indenting takes Python's slow encoder)
    indent = 2 if stdout_is_terminal() else None
    click.echo(json.dumps(doc, indent=indent, sort_keys=False))


PROGRESS_EVERY_S = 10.0
"""Off a terminal, a progress line at least this often while a step runs."""


@contextmanager
def status(
    message: str, enabled: bool = True, limit_s: float | None = None
) -> Iterator[Callable[[str], None]]:
    """Progress on stderr while a step runs (not with --json): at a terminal a spinner
    with the seconds spent (and the time limit, when given); off one, a line when the
    step starts, a line when it moves on to another phase, and one every
    PROGRESS_EVERY_S seconds in between, each with the seconds spent.

    Yields a function that names the current phase (`update("solving ...")`).
    """
    if not enabled:
        yield lambda text: None
        return
    start = time.perf_counter()
    limit = f", limit {limit_s:g} s" if limit_s is not None else ""
    phase = [""]

    def line() -> str:
        spent = f"{time.perf_counter() - start:.0f} s{limit}"
        return f"{message} ({spent})" + (f": {phase[0]}" if phase[0] else "")

    with ExitStack() as stack:
        console = _stderr()
        if console.is_terminal:
            spinner = stack.enter_context(console.status(line()))
            every = 1.0

            def show() -> None:
                spinner.update(line())
        else:
            every = PROGRESS_EVERY_S
            lock = threading.Lock()  # the ticker and the caller both print

            def show() -> None:
                with lock:
                    click.echo(f"rhino: {line()}", err=True)

            show()
        done = threading.Event()
        stack.callback(done.set)
        threading.Thread(target=_tick, args=(done, every, show), daemon=True).start()

        def update(text: str) -> None:
            if text != phase[0]:
                phase[0] = text
                show()

        yield update


def _tick(done: threading.Event, every: float, action: Callable[[], None]) -> None:
    while not done.wait(every):
        action()


def human_count(n: float) -> str:
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f}"
