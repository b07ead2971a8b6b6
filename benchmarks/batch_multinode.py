"""`peakmem batch --ray-address` against a multi-node Ray cluster, without code changes.

Starts a Ray cluster of `--nodes` nodes on this machine (`ray.cluster_utils.Cluster`: one head
and `nodes - 1` worker nodes, each its own raylet and object store with `--cpus-per-node` CPUs,
the way Ray tests multi-node behaviour on one host), then runs the CLI exactly as a user would,
`peakmem batch JOBS --ray-address ADDRESS`, in a separate process, and checks the result file:
every job once, all `done`, and which Ray node ran each job (`ray_node`). The fake estimator
spins the CPU `--cpu-seconds` per job, as a real estimate is CPU work.

    PYTHONPATH=src python benchmarks/batch_multinode.py --nodes 2 --jobs 200 --cpu-seconds 0.05 [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--cpu-seconds", type=float, default=0.05)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.nodes < 1 or args.jobs < 1 or args.cpus_per_node < 1:
        raise SystemExit("--nodes, --jobs and --cpus-per-node must be >= 1")

    from ray.cluster_utils import Cluster

    started = time.perf_counter()
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False})
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus_per_node)
        cluster.wait_for_nodes()
        cluster_seconds = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as tmp:
            jobs = Path(tmp) / "jobs.jsonl"
            jobs.write_text("".join(
                json.dumps({"id": f"job-{i}", "files": {"train.py": f"# {i}\n"},
                            "command": ["python", "train.py"]}) + "\n" for i in range(args.jobs)))
            out = Path(tmp) / "results.jsonl"
            env = {**os.environ, "PEAKMEM_FAKE_ESTIMATE_CPU_SECONDS": str(args.cpu_seconds)}
            batch_started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "peakmem", "batch", str(jobs), "-o", str(out), "--json",
                 "--ray-address", cluster.address,
                 "--estimator", "peakmem.service.estimators:fake_estimator"],
                env=env, capture_output=True, text=True, timeout=3600)
            batch_seconds = time.perf_counter() - batch_started
            if proc.returncode != 0:
                raise SystemExit(f"peakmem batch exited {proc.returncode}: {proc.stderr[-2000:]}")
            lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    finally:
        cluster.shutdown()
    ids = [line["id"] for line in lines]
    per_node = collections.Counter(line.get("ray_node") for line in lines)
    report = {
        "nodes": args.nodes, "cpus_per_node": args.cpus_per_node, "jobs": args.jobs,
        "cpu_seconds_per_job": args.cpu_seconds,
        "cluster_start_seconds": round(cluster_seconds, 1),
        "batch_seconds": round(batch_seconds, 1),
        "results": len(lines), "distinct_ids": len(set(ids)),
        "done": sum(line["status"] == "done" for line in lines),
        "lost": args.jobs - len(set(ids)), "duplicated": len(ids) - len(set(ids)),
        "nodes_used": len([node for node in per_node if node]),
        "jobs_per_node": sorted(per_node.values(), reverse=True),
        "load_average": os.getloadavg()[0], "cpu_count": os.cpu_count(),
    }
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
