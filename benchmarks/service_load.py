"""Load test of `peakmem serve`: N concurrent requests on loopback, a mix of cached and new jobs.

The server runs in its own process with the fake estimator (no real estimates: this measures
the service, not peakmem's capture). Phase 1 warms the cache with `--cached` distinct jobs;
phase 2 sends `--requests` requests at once: half re-submissions of cached jobs, half new jobs
(`--duplicates` of them sent twice). Then every new job is polled to a final status.

Phase 3 sends `--requests` cached requests again with `--steady-in-flight` in flight at a time:
the cached answer's latency without a 1,000-request queue in front of it.

`--estimator fake` runs the fake estimator in the server's worker threads; `fake-process` runs it
in a worker process of its own per job, started like `peakmem estimate`'s (at `--job-nice`), so
the service's whole overhead is measured without the capture's cost.

`--floor` first measures a bare ASGI app (it reads the body and answers a fixed 200 JSON) on
uvicorn, on the same machine, under the same burst and steady load: the latency no Python
service on this machine can go below. Its figures are reported as `floor_*`.

Checks: every request answered (no error, no 429 with the queue sized for the burst), every
distinct job got exactly one id and ran exactly once (the fake estimator's runs, logged by every
server process to `PEAKMEM_FAKE_ESTIMATE_LOG`, equal the number of distinct jobs), every job
final. Reports latency percentiles. `--processes N` runs the server as N processes sharing a
`--store`.

    PYTHONPATH=src python benchmarks/service_load.py --requests 1000 [--json]
    PYTHONPATH=src python benchmarks/service_load.py --requests 1000 --floor --estimator fake-process
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ESTIMATORS = {
    "fake": "peakmem.service.estimators:fake_estimator",
    "fake-process": "peakmem.service.estimators:fake_process_estimator",
}
"""`--estimator` choices: the fake estimator in the server's worker threads, or in a worker
process of its own per job."""
BARE_ANSWER = b'{"id":"' + b"0" * 64 + b'","status":"done"}'


async def bare_app(scope: dict, receive, send) -> None:
    """The floor: an ASGI app that reads the request body and answers a fixed JSON, nothing
    else (no framework, no routing, no validation, no store)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(BARE_ANSWER)).encode())]})
    await send({"type": "http.response.body", "body": BARE_ANSWER})


def start_bare(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-bare", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return wait_up(proc, port)


def start_server(port: int, workers: int, max_queue: int, estimate_seconds: float,
                 estimator: str = "fake", job_nice: int | None = None,
                 processes: int = 1, store: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PEAKMEM_FAKE_ESTIMATE_SECONDS": str(estimate_seconds),
           "PEAKMEM_FAKE_ESTIMATE_LOG": os.path.join(str(store), "runs.log")}
    nice = ["--job-nice", str(job_nice)] if job_nice is not None else []
    if processes > 1:
        nice += ["--processes", str(processes), "--store", str(store)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "peakmem", "serve", "--port", str(port), "--sandbox", "off",
         "--workers", str(workers), "--max-queue", str(max_queue), "--log-level", "warning",
         "--estimator", ESTIMATORS[estimator], *nice],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    return wait_up(proc, port)


def wait_up(proc: subprocess.Popen, port: int) -> subprocess.Popen:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code in (200, 405):
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def job(n: int, tag: str) -> dict:
    return {"files": {"train.py": f"# {tag} {n}\n"}, "command": ["python", "train.py", str(n)]}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


async def raw_post(port: int, body: bytes) -> tuple[int, dict, float]:
    """One POST /v1/estimates on its own connection, written and read with asyncio streams (an
    HTTP client library costs more CPU per request than the server's handler: it would be the
    client that is measured)."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/estimates HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nConnection: close\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    response = await reader.read()
    seconds = time.perf_counter() - start
    writer.close()
    head, _, payload = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(payload), seconds


async def post_all(url: str, bodies: list[dict], in_flight: int | None = None
                   ) -> list[tuple[int, dict, float]]:
    """POST every body, at most `in_flight` at a time (default: all at once); (status, body,
    seconds from connecting to the whole answer) each."""
    port = int(url.rsplit(":", 1)[1])
    gate = asyncio.Semaphore(in_flight or len(bodies))
    encoded = [json.dumps(body).encode() for body in bodies]

    async def one(body: bytes) -> tuple[int, dict, float]:
        async with gate:
            return await raw_post(port, body)

    return await asyncio.gather(*(one(body) for body in encoded))


async def wait_all(url: str, ids: set[str], deadline_s: float) -> dict[str, dict]:
    final: dict[str, dict] = {}
    async with httpx.AsyncClient(base_url=url, timeout=60,
                                 limits=httpx.Limits(max_connections=50)) as client:
        deadline = time.monotonic() + deadline_s
        sem = asyncio.Semaphore(50)
        while len(final) < len(ids) and time.monotonic() < deadline:
            todo = [i for i in ids if i not in final]

            async def get(i: str) -> None:
                async with sem:
                    body = (await client.get(f"/v1/estimates/{i}")).json()
                if body["status"] in ("done", "failed"):
                    final[i] = body

            await asyncio.gather(*(get(i) for i in todo))
            if len(final) < len(ids):
                await asyncio.sleep(0.2)
    return final


def runs_of(url: str, log: str) -> int:
    """Runs of the estimator: the lines of the runs log every server process appends to, or,
    from a server whose fake estimator keeps none (before it did), its /metrics count."""
    if os.path.exists(log):
        with open(log, encoding="utf-8") as runs:
            return sum(1 for line in runs if line.strip())
    metrics = httpx.get(f"{url}/metrics").text
    return int(sum(float(v) for v in re.findall(
        r'peakmem_jobs_finished_total\{status="\w+"\} (\S+)', metrics)))


def measure_floor(args: argparse.Namespace) -> dict:
    """The bare ASGI app's latency under the same burst (`--requests` at once) and the same steady
    load (`--steady-in-flight` in flight), with a cached request's body."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_bare(port)
    try:
        body = job(0, "cached")
        asyncio.run(post_all(url, [body] * min(args.cached, args.requests)))  # warm, like phase 1
        burst = [t for _, _, t in asyncio.run(post_all(url, [body] * args.requests))]
        steady = [t for _, _, t in asyncio.run(post_all(url, [body] * args.requests,
                                                        args.steady_in_flight))]
    finally:
        server.terminate()
        server.wait(30)
    return {"floor_burst_p50_ms": round(pct(burst, 0.50), 1),
            "floor_burst_p99_ms": round(pct(burst, 0.99), 1),
            "floor_steady_p50_ms": round(pct(steady, 0.50), 1),
            "floor_steady_p99_ms": round(pct(steady, 0.99), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--cached", type=int, default=200, help="distinct jobs warmed first")
    parser.add_argument("--duplicates", type=int, default=100,
                        help="new jobs sent twice in the burst")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--estimate-seconds", type=float, default=0.01)
    parser.add_argument("--steady-in-flight", type=int, default=10,
                        help="requests in flight for the steady cached phase")
    parser.add_argument("--estimator", choices=sorted(ESTIMATORS), default="fake",
                        help="fake: in the server's threads; fake-process: a worker process per "
                        "job, started like peakmem estimate's")
    parser.add_argument("--job-nice", type=int, default=None,
                        help="the server's --job-nice (default: the server's default)")
    parser.add_argument("--processes", type=int, default=1,
                        help="the server's --processes (with a fresh --store)")
    parser.add_argument("--floor", action="store_true",
                        help="first measure a bare ASGI app under the same load (floor_* keys)")
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.serve_bare is not None:
        import uvicorn

        uvicorn.run(bare_app, host="127.0.0.1", port=args.serve_bare, log_level="warning")
        return
    floor = measure_floor(args) if args.floor else {}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store = tempfile.mkdtemp(prefix="peakmem-load-")  # the runs log, and --store
    server = start_server(port, args.workers, args.requests + args.cached + 10,
                          args.estimate_seconds, args.estimator, args.job_nice, args.processes,
                          store)
    try:
        warm = asyncio.run(post_all(url, [job(n, "cached") for n in range(args.cached)]))
        cached_ids = {body["id"] for _, body, _ in warm}
        asyncio.run(wait_all(url, cached_ids, 120))
        n_cached = args.requests // 2
        n_new = args.requests - n_cached
        distinct_new = n_new - args.duplicates
        bodies = [("cached", job(n % args.cached, "cached")) for n in range(n_cached)]
        bodies += [("new", job(n, "new")) for n in range(distinct_new)]
        bodies += [("new", job(n, "new")) for n in range(args.duplicates)]
        order = list(range(len(bodies)))
        order = order[::2] + order[1::2]  # interleave cached and new
        burst_start = time.perf_counter()
        answers = asyncio.run(post_all(url, [bodies[i][1] for i in order]))
        burst_seconds = time.perf_counter() - burst_start
        kinds = [bodies[i][0] for i in order]
        errors = [(code, body) for code, body, _ in answers if code not in (200, 202)]
        cached_latency = [t for (code, body, t), kind in zip(answers, kinds, strict=True)
                          if kind == "cached"]
        cached_done = sum(1 for (code, body, _), kind in zip(answers, kinds, strict=True)
                          if kind == "cached" and body.get("status") == "done")
        new_latency = [t for (_, _, t), kind in zip(answers, kinds, strict=True) if kind == "new"]
        id_of: dict[str, set[str]] = {}
        for (_code, body, _), i in zip(answers, order, strict=True):
            key = json.dumps(bodies[i][1], sort_keys=True)
            id_of.setdefault(key, set()).add(body.get("id"))
        one_id_each = all(len(ids) == 1 for ids in id_of.values())
        new_ids = {body["id"] for (code, body, _), kind in zip(answers, kinds, strict=True)
                   if kind == "new" and "id" in body}
        final = asyncio.run(wait_all(url, new_ids, 300))
        # cached answers at a steady load (`--steady-in-flight` requests in flight)
        steady = asyncio.run(post_all(url, [job(n % args.cached, "cached")
                                            for n in range(args.requests)], args.steady_in_flight))
        steady_latency = [t for _, _, t in steady]
        ran = runs_of(url, os.path.join(store, "runs.log"))
        report = {
            "estimator": args.estimator,
            "processes": args.processes,
            "load_average_1m": round(os.getloadavg()[0], 1),
            **floor,
            "requests": len(answers),
            "errors": len(errors),
            "burst_seconds": round(burst_seconds, 3),
            "cached_requests": len(cached_latency),
            "cached_answered_done": cached_done,
            "cached_p50_ms": round(pct(cached_latency, 0.50), 1),
            "cached_p99_ms": round(pct(cached_latency, 0.99), 1),
            "cached_mean_ms": round(statistics.mean(cached_latency) * 1000, 1),
            "steady_in_flight": args.steady_in_flight,
            "steady_cached_p50_ms": round(pct(steady_latency, 0.50), 1),
            "steady_cached_p99_ms": round(pct(steady_latency, 0.99), 1),
            "steady_requests_per_s": round(len(steady) / sum(t for _, _, t in steady)
                                           * args.steady_in_flight, 1),
            "new_requests": len(new_latency),
            "new_p50_ms": round(pct(new_latency, 0.50), 1),
            "new_p99_ms": round(pct(new_latency, 0.99), 1),
            "distinct_new_jobs": len(new_ids),
            "new_jobs_final": len(final),
            "one_id_per_distinct_job": one_id_each,
            "jobs_run_by_server": int(ran),
            "distinct_jobs": len(cached_ids) + len(new_ids),
        }
        report["lost"] = report["distinct_new_jobs"] - report["new_jobs_final"] + report["errors"]
        report["duplicated"] = report["jobs_run_by_server"] - report["distinct_jobs"]
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(store, ignore_errors=True)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:28} {value}")
    ok = report["lost"] == 0 and report["duplicated"] == 0 and one_id_each
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
