"""Estimators the batch tests load by name (`module:function`), also in Ray workers."""

from __future__ import annotations

from peakmem.service.jobs import WorkerLost


def always_lost(job, ctx):
    raise WorkerLost("the estimate's worker process was killed by SIGKILL", signal="SIGKILL")
