"""The failure contract of the commands that read files (`replay`, `simulate`, `bench`).

A bad flag, argument or input file: exit 2, kind `bad_input`. A bug in peakmem: exit 70, kind
`internal`. Either way one line on stderr (`peakmem: error: ...` / `peakmem internal error:
...`), and with `--json` ONE object on stdout:
`{"error": {"kind", "message", "exit_code", "reason", "job_exit_code", "signal", "traceback"}}`.
A command opts in with `cls=ContractCommand`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from peakmem.inputs import InputError, one_line

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 70


class BadInput(InputError):
    """A bad flag or argument value (not tied to a file)."""


def _bad_input_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the user's input is wrong. Imported lazily: a command must not pay
    for modules it does not use."""
    from peakmem.allocator.config import AllocatorConfigError
    from peakmem.allocator.rules import UnknownTorchVersion
    from peakmem.allocator.simulate import TraceError
    from peakmem.profiles import ProfileError

    types: list[type[BaseException]] = [
        InputError,
        AllocatorConfigError,
        UnknownTorchVersion,
        TraceError,
        ProfileError,
    ]
    if "peakmem.datasets.loaders" in sys.modules:
        from peakmem.datasets.loaders import DatasetUnavailable

        types.append(DatasetUnavailable)
    return tuple(types)


def error_object(kind: str, message: str, exit_code: int, reason: str | None = None,
                 trace: str | None = None) -> dict[str, Any]:
    """The contract's JSON error object (`{"error": {...}}`) of a failure before any job ran."""
    return {"error": {"kind": kind, "message": message, "exit_code": exit_code, "reason": reason,
                      "job_exit_code": None, "signal": None, "traceback": trace}}


def report_error(
    kind: str, message: str, exit_code: int, as_json: bool, trace: str | None = None
) -> NoReturn:
    """Print one failure the contract's way and exit with `exit_code`."""
    line = one_line(message, 1000)
    if kind == "internal":
        text = line if line.startswith("peakmem internal error") else f"peakmem internal error: {line}"
    else:
        text = line if line.startswith("peakmem: ") else f"peakmem: error: {line}"
    click.echo(text, err=True)
    if as_json:
        message = text if kind == "internal" else line.removeprefix("peakmem: error: ")
        click.echo(json.dumps(error_object(kind, message, exit_code, trace=trace)))
    raise SystemExit(exit_code)


def _wants_json(args: Sequence[str]) -> bool:
    return "--json" in args


def _internal_message(exc: BaseException) -> tuple[str, str]:
    """'TypeError: ... (at peakmem/x.py:12 in f)' and the full traceback text."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}peakmem{os.sep}" in f.filename]
    where = ""
    if ours:
        last = ours[-1]
        short = last.filename[last.filename.rfind(f"{os.sep}peakmem{os.sep}") + 1 :]
        where = f" (at {short}:{last.lineno} in {last.name})"
    text = f"{type(exc).__name__}: {exc}{where}"
    return text, "".join(traceback.format_exception(exc))


class ContractUsage(click.Command):
    """A click command whose bad command line follows the contract (exit 2, one `peakmem:
    error:` line, one JSON object with `--json`), for commands with exit statuses of their own
    once running (`measure`, `warm`); click's own usage error is three lines."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        as_json = _wants_json(args)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:
            report_error("bad_input", exc.format_message(), EXIT_BAD_INPUT, as_json)

    def invoke(self, ctx: click.Context) -> Any:
        """A usage error the command's own checks raise (`measure --out train.py`) as one
        line too: click printed it as three (usage, hint, `Error: ...`) with no JSON object."""
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:
            report_error("bad_input", exc.format_message(), EXIT_BAD_INPUT,
                         bool(ctx.params.get("as_json")))


class ContractCommand(ContractUsage):
    """A click command whose every failure follows the contract (exit 2 / 70, one line, one
    JSON object with `--json`)."""

    def invoke(self, ctx: click.Context) -> Any:
        as_json = bool(ctx.params.get("as_json"))
        try:
            return super().invoke(ctx)
        except (SystemExit, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except click.ClickException as exc:
            report_error("bad_input", exc.format_message(), EXIT_BAD_INPUT, as_json)
        except Exception as exc:  # noqa: BLE001 - the contract: every failure is reported
            if isinstance(exc, _bad_input_types()):
                report_error("bad_input", str(exc), EXIT_BAD_INPUT, as_json)
            text, trace = _internal_message(exc)
            report_error("internal", text, EXIT_INTERNAL, as_json, trace)
