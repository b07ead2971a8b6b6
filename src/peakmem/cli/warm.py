"""`peakmem warm`: start, ask or stop the warm job process that later estimates fork from."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from peakmem.cli.contract import EXIT_BAD_INPUT, ContractUsage, report_error
from peakmem.cli.finite import FiniteFloatRange


def _echo(info: dict[str, Any], as_json: bool, headline: str) -> None:
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    click.echo(headline)
    if not info.get("running"):
        return
    up = time.time() - float(info.get("started", time.time()))
    idle = info.get("idle_seconds")
    click.echo(f"  pid {info['pid']}, up {up:.0f} s, {info.get('served', 0)} job(s) served, "
               f"{info.get('running_jobs', 0)} running; exits after "
               + (f"{idle:g} s idle" if idle else "no idle time (until --stop)"))
    click.echo(f"  socket {info['socket']}")
    click.echo(f"  python {info['python']}, peakmem {info['peakmem']} from {info['source']}")
    if info.get("preload"):
        click.echo(f"  preloaded: {', '.join(info['preload'])}")
    for error in info.get("preload_errors", []):
        click.echo(f"  could not preload {error}", err=True)


@click.command("warm", cls=ContractUsage)
@click.option("--preload", "preload", multiple=True, metavar="MODULE",
              help="A module to import in the warm process (repeatable), e.g. "
                   "transformers.models.gpt2.modeling_gpt2 for GPT-2 jobs.")
@click.option("--idle", type=FiniteFloatRange(min=0), default=None, metavar="SECONDS",
              help="Exit after this many seconds without a request (default 1800; 0: never).")
@click.option("--stop", is_flag=True, help="Stop the warm process (after its running jobs).")
@click.option("--status", is_flag=True,
              help="Say whether a warm process runs (exit status 1 when none does).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def warm(preload: tuple[str, ...], idle: float | None, stop: bool, status: bool,
         as_json: bool) -> None:
    """Start a warm job process for this python and peakmem: it imports torch, peakmem's capture
    and the --preload modules once, then every estimate of this user that runs its job in a
    child process (`peakmem estimate`, fit search, the scheduler) forks that child from it
    instead of starting a fresh interpreter. The estimates are the same; the notes say when a
    job ran warm, and why one started cold. A preloaded module is used only for jobs whose
    script imports its package. PEAKMEM_WARM=0 turns it off for one command. The socket is
    private to this user; requests are JSON, never code."""
    from peakmem.jobs import zygote_client
    from peakmem.jobs.zygote_server import DEFAULT_IDLE_SECONDS

    if stop and status:
        report_error("bad_input", "give --stop or --status, not both", EXIT_BAD_INPUT, as_json)
    if (stop or status) and (preload or idle is not None):
        report_error("bad_input", "--preload and --idle apply when starting", EXIT_BAD_INPUT,
                     as_json)
    try:
        zygote_client.runtime_dir()
    except OSError as exc:  # PEAKMEM_RUNTIME_DIR names a file, a device, a loop: bad input,
        # not `--status`'s exit 1 (no warm process)
        report_error("bad_input", f"no private runtime directory: {exc}", EXIT_BAD_INPUT, as_json)
    current = zygote_client.status()
    if status:
        _echo(current or {"running": False}, as_json,
              "a warm job process is running" if current else "no warm job process")
        raise SystemExit(0 if current else 1)
    if stop:
        stopped = zygote_client.stop()
        _echo({"running": False, "stopped": stopped}, as_json,
              "stopped the warm job process" if stopped else "no warm job process")
        return
    if current is not None:
        _echo(current, as_json, "a warm job process is already running (--stop it to restart)")
        return
    try:
        info = zygote_client.start(list(preload), DEFAULT_IDLE_SECONDS if idle is None else idle)
    except (RuntimeError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    _echo(info, as_json, "started a warm job process")
