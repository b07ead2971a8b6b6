"""`peakmem serve`: the estimation API and the Kubernetes admission webhook (FastAPI on uvicorn)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from peakmem.cli.contract import ContractCommand
from peakmem.cli.finite import FiniteFloatRange


def _directory(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """click.Path(file_okay=False) refuses only regular files: /dev/null or a FIFO passed, and
    the server started with a working directory no job can run in."""
    if value is not None and not os.path.isdir(value):
        raise click.BadParameter(f"{value!r} is not a directory", ctx, param)
    return value


@click.command("serve", cls=ContractCommand)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 256),
              help="Estimates run at once.")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(1, 100000),
              help="Jobs that may wait for a worker; past it, 429.")
@click.option("--max-seconds", default=600.0, show_default=True,
              type=FiniteFloatRange(0, 86400, min_open=True),
              help="Wall-clock limit of one estimate (a request may only lower it).")
@click.option("--max-host-memory", default="16GiB", show_default=True, metavar="BYTES",
              help="Host RAM one job may hold (a request may only lower it).")
@click.option("--sandbox", "sandbox", type=click.Choice(["required", "auto", "off"]),
              default="auto", show_default=True,
              help="required: jobs fail (unsupported) where no sandbox works; auto: sandbox when "
              "it works, else run without and say so in /healthz and each result's notes.")
@click.option("--emit", "fmt", default="hami", show_default=True,
              help="Scheduler format of the webhook's patch (the --emit formats).")
@click.option("--admission-budget", default=8.0, show_default=True,
              type=FiniteFloatRange(0, 30, min_open=True),
              help="Seconds the webhook waits for an estimate.")
@click.option("--failure-policy", type=click.Choice(["open", "closed"]), default="open",
              show_default=True,
              help="Webhook without an estimate in time (or a failed one): open admits the pod "
              "unchanged with a warning, closed refuses it.")
@click.option("--admission-workdir", type=click.Path(exists=True, file_okay=False), default=None,
              callback=_directory,
              help="Directory where a pod's peakmem.io/command runs when no ConfigMap sends its "
              "files (e.g. a shared code volume).")
@click.option("--configmaps/--no-configmaps", default=False, show_default=True,
              help="Let the webhook read a pod's peakmem.io/configmap (needs Kubernetes access).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="TLS certificate (PEM); Kubernetes calls webhooks over HTTPS only.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="TLS private key (PEM).")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A file holding the bearer token the estimate routes require (also "
              "PEAKMEM_SERVICE_TOKEN); without either, they are open to whoever can connect.")
@click.option("--estimator", default=None, metavar="MODULE:FUNCTION",
              help="Run estimates with this callable instead of `peakmem estimate` (testing, "
              "load benchmarks: peakmem.service.estimators:fake_estimator).")
@click.option("--job-nice", default=10, show_default=True, type=click.IntRange(0, 19),
              help="Niceness added to each job's worker process, so that estimates (CPU-bound) "
              "yield to the server answering requests; 0 runs them at the server's priority.")
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              metavar="DIR", help="Keep final results in DIR too, shared by the server "
              "processes of this machine (--processes), so any of them answers a cached job.")
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes on the one port (each with --workers); more than one "
              "needs --store.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(host: str, port: int, workers: int, max_queue: int, max_seconds: float,
          max_host_memory: str, sandbox: str, fmt: str, admission_budget: float,
          failure_policy: str, admission_workdir: str | None, configmaps: bool,
          tls_cert: str | None, tls_key: str | None, token_file: str | None, estimator: str | None, job_nice: int, store_dir: str | None, processes: int,
          log_level: str) -> None:
    """Serve estimates over HTTP: POST /v1/estimates, GET /v1/estimates/{id}, POST
    /v1/admission (Kubernetes mutating webhook), /healthz, /metrics, /docs."""
    from peakmem.cli.common import parse_bytes
    from peakmem.cli.contract import BadInput

    try:
        import uvicorn

        from peakmem.service.admission import AdmissionConfig, kubernetes_configmaps
        from peakmem.service.app import ServiceConfig, create_app
        from peakmem.service.jobs import load_estimator
    except ImportError as exc:
        raise BadInput(f"`peakmem serve` needs the service extra (pip install "
                       f"'peakmem[service]'): {exc}") from None
    if (tls_cert is None) != (tls_key is None):
        raise BadInput("--tls-cert and --tls-key go together")
    from peakmem.schedule.emit import FORMATS

    if str(fmt).strip().lower() not in FORMATS:
        raise BadInput(f"--emit: unknown emit format {fmt!r}; choose one of {', '.join(FORMATS)}")
    try:
        run_estimate = load_estimator(estimator) if estimator else None
    except (ImportError, AttributeError, ValueError) as exc:
        raise BadInput(f"--estimator {estimator!r}: {exc}") from None
    if processes > 1 and not store_dir:
        raise BadInput("--processes above 1 needs --store DIR: each process would otherwise "
                       "answer only the jobs it ran")
    if store_dir:
        try:
            os.makedirs(store_dir, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"--store: cannot use {store_dir}: {exc.strerror or exc}") from None
        if not os.access(store_dir, os.W_OK | os.X_OK):
            raise BadInput(f"--store: {store_dir} is not writable")
    token = os.environ.get("PEAKMEM_SERVICE_TOKEN") or None
    if token_file:
        token = _read_token(token_file)
    if tls_cert is not None and tls_key is not None:
        _check_tls(tls_cert, tls_key)
    config = ServiceConfig(
        token=token, job_nice=job_nice,
        store_dir=os.path.abspath(store_dir) if store_dir else None,
        workers=workers, max_queue=max_queue, max_seconds=max_seconds,
        max_host_memory=parse_bytes(max_host_memory, "--max-host-memory"), sandbox=sandbox,
        admission=AdmissionConfig(fmt=fmt, budget_seconds=admission_budget,
                                  failure_policy=failure_policy,
                                  workdir=os.path.abspath(admission_workdir) if admission_workdir
                                  else None),
    )
    try:
        reader = kubernetes_configmaps() if configmaps else None
    except Exception as exc:  # noqa: BLE001 - kubernetes' config errors have no common base
        raise BadInput(f"--configmaps: no Kubernetes access here ({type(exc).__name__}: "
                       f"{exc})") from None
    from peakmem.service.fast_path import SWITCH_INTERVAL_SECONDS

    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)  # the loop gets the GIL back sooner
    options = {"log_level": log_level, "ssl_certfile": tls_cert, "ssl_keyfile": tls_key,
               "timeout_graceful_shutdown": 10}
    if processes > 1:
        _serve_processes(lambda: create_app(config, estimator=run_estimate, configmaps=reader),
                         host, port, processes, options)
        return
    _check_listen(host, port)
    app = create_app(config, estimator=run_estimate, configmaps=reader)
    uvicorn.run(app, host=host, port=port, **options)


_SMALL_FILE_BYTES = 1 << 20
"""A token, certificate or key file is at most this large (a real one is a few KiB)."""


def _read_token(token_file: str) -> str:
    """The bearer token in `token_file`: a regular UTF-8 file under 1 MiB, opened without
    blocking (a FIFO or /dev/zero given as --token-file hung the server before it started)."""
    from peakmem.cli.contract import BadInput
    from peakmem.inputs import InputError, open_regular_file, read_capped

    try:
        with open_regular_file(token_file, _SMALL_FILE_BYTES) as handle:
            token = read_capped(handle, _SMALL_FILE_BYTES, token_file).decode("utf-8").strip()
    except InputError as exc:
        raise BadInput(f"--token-file: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"--token-file: cannot read {token_file}: {exc}") from None
    if not token:
        raise BadInput(f"--token-file: {token_file} is empty")
    return token


def _check_tls(cert: str, key: str) -> None:
    """--tls-cert / --tls-key are regular files holding a certificate and its key, checked
    before uvicorn loads them (a file that is not PEM was exit 70, an SSLError traceback)."""
    import ssl

    from peakmem.cli.contract import BadInput
    from peakmem.inputs import InputError, open_regular_file

    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            open_regular_file(path, _SMALL_FILE_BYTES).close()
        except InputError as exc:
            raise BadInput(f"{flag}: {exc}") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise BadInput(f"--tls-cert / --tls-key: not a usable certificate and key ({exc})") from None


def _serve_processes(make_app: Any, host: str, port: int, processes: int,
                     options: dict[str, Any]) -> None:
    from peakmem.cli.contract import BadInput
    from peakmem.service.processes import ChildFailed, listen, serve_processes

    try:
        sock = listen(host, port)
    except OSError as exc:
        raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        serve_processes(make_app, sock, processes, options)
    except ChildFailed as exc:
        raise RuntimeError(f"peakmem serve: {exc}") from None


def _check_listen(host: str, port: int) -> None:
    """Bad input (exit 2, one line) when the address cannot be listened on (in use, unknown)."""
    import socket

    from peakmem.cli.contract import BadInput

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.create_server((host, port), family=family):
            pass
    except OSError as exc:
        raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
