"""The service's Prometheus metrics, in a registry of its own (one per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class ServiceMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("peakmem_estimate_requests", "Estimate requests by outcome",
                                ["outcome"], registry=r)
        self.fast_answers = Counter(
            "peakmem_estimate_fast_answers",
            "Estimate requests for known jobs answered before routing and validation",
            registry=r)
        self.jobs = Counter("peakmem_jobs_finished", "Estimate jobs finished, by status",
                            ["status"], registry=r)
        self.retries = Counter("peakmem_job_retries", "Jobs retried after their worker was lost",
                               registry=r)
        self.admission = Counter("peakmem_admission_reviews", "Admission reviews by result",
                                 ["result"], registry=r)
        self.queued = Gauge("peakmem_jobs_queued", "Jobs waiting for a worker", registry=r)
        self.running = Gauge("peakmem_jobs_running", "Jobs a worker is running", registry=r)
        self.seconds = Histogram(
            "peakmem_job_seconds", "Wall-clock seconds of one estimate", registry=r,
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
