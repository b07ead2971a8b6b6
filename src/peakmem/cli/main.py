"""The `peakmem` entry point. Each command lives in its own module and is imported only when used,
so `peakmem replay` never pays for importing the capture machinery."""

from __future__ import annotations

import contextlib
import importlib
import sys

import click

from peakmem import __version__

# command name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "batch": "peakmem.cli.batch:batch",
    "bench": "peakmem.cli.bench:bench",
    "estimate": "peakmem.cli.estimate:estimate_cmd",
    "fit": "peakmem.cli.fit:fit_cmd",
    "measure": "peakmem.cli.measure:measure",
    "pack": "peakmem.cli.pack:pack",
    "replay": "peakmem.cli.replay:replay",
    "serve": "peakmem.cli.serve:serve",
    "simulate": "peakmem.cli.simulate:simulate_trace",
    "warm": "peakmem.cli.warm:warm",
}


def tolerant_output() -> None:
    """Characters stdout or stderr cannot encode (`PYTHONIOENCODING=ascii`, a C locale: the
    table's `…`, a job's non-ASCII id) are written escaped: printing one raised
    UnicodeEncodeError, exit 70 after the estimate had succeeded."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            with contextlib.suppress(ValueError, OSError, AttributeError):
                reconfigure(errors="backslashreplace")


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """An argument with a NUL byte (from a program's execv-less call, a batch line, the
        Python API) is refused at once: no path or value can hold one (open() raised
        ValueError deep in a command: exit 70 with a traceback)."""
        for index, arg in enumerate(args):
            if isinstance(arg, str) and "\0" in arg:
                from peakmem.cli.contract import report_error

                report_error("bad_input", f"argument {index + 1} contains a NUL byte, which no "
                             "file name or value can hold", 2, "--json" in args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        """An unexpected exception is peakmem's bug: "peakmem internal error: ..." with
        peakmem's frames on stderr, exit 70 (the contract's `internal`)."""
        tolerant_output()
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort,
                SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001
            import traceback

            click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
            click.echo(f"peakmem internal error: {type(exc).__name__}: {exc}", err=True)
            raise SystemExit(70) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="peakmem")
def main() -> None:
    """Predict the peak GPU memory of a PyTorch training job before it runs, without a GPU."""


if __name__ == "__main__":
    main()
