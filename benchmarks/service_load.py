"""Load test of `peakmem serve`: N concurrent requests on loopback, a mix of cached and new jobs.

The server runs in its own process with the fake estimator (no real estimates: this measures
the service, not peakmem's capture). Phase 1 warms the cache with `--cached` distinct jobs;
phase 2 sends `--requests` requests at once: half re-submissions of cached jobs, half new jobs
(`--duplicates` of them sent twice). Then every new job is polled to a final status.

Phase 3 sends `--requests` cached requests again with `--steady-in-flight` in flight at a time:
the cached answer's latency without a 1,000-request queue in front of it.

Checks: every request answered (no error, no 429 with the queue sized for the burst), every
distinct job got exactly one id and ran exactly once (the server's `peakmem_jobs_finished_total`
equals the number of distinct jobs), every job final. Reports latency percentiles.

    PYTHONPATH=src python benchmarks/service_load.py --requests 1000 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, workers: int, max_queue: int, estimate_seconds: float) -> subprocess.Popen:
    env = {**os.environ, "PEAKMEM_FAKE_ESTIMATE_SECONDS": str(estimate_seconds)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "peakmem", "serve", "--port", str(port), "--sandbox", "off",
         "--workers", str(workers), "--max-queue", str(max_queue), "--log-level", "warning",
         "--estimator", "peakmem.service.estimators:fake_estimator"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(port, args.workers, args.requests + args.cached + 10,
                          args.estimate_seconds)
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
        metrics = httpx.get(f"{url}/metrics").text
        ran = sum(float(v) for v in re.findall(r'peakmem_jobs_finished_total\{status="\w+"\} (\S+)', metrics))
        report = {
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
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:28} {value}")
    ok = report["lost"] == 0 and report["duplicated"] == 0 and one_id_each
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
