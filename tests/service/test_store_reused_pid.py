"""A claim in the shared store names its process by id and start time: a live process that got a
dead claimant's id (a restarted container numbers its processes from 1 again, while an emptyDir
store keeps the old claims) does not keep the claim alive."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from peakmem.service.store import ResultStore, process_start_time

KEY = "cd" * 32

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or
                                process_start_time(os.getpid()) is None,
                                reason="process start times come from Linux's /proc")


def write_claim(store: ResultStore, **body) -> None:
    (store.root / f"{KEY}.claim").write_text(json.dumps(
        {"pid": os.getpid(), "owner": "other", "status": "queued", "since": time.time(), **body}))


def test_a_claim_records_its_process_start_time(tmp_path):
    store = ResultStore(tmp_path)
    assert store.claim(KEY)
    claim = store.read_claim(KEY)
    assert claim.pid == os.getpid() and claim.started == process_start_time(os.getpid())
    assert store.live(claim)


def test_a_live_process_with_another_start_time_is_a_reused_id(tmp_path):
    store = ResultStore(tmp_path)
    write_claim(store, started=process_start_time(os.getpid()) - 1)
    assert store.claimant(KEY) is None and store.claim(KEY)  # taken over
    assert store.read_claim(KEY).owner == store.owner


def test_the_same_process_keeps_its_claim_and_older_claims_without_a_start_time_too(tmp_path):
    store = ResultStore(tmp_path)
    write_claim(store, started=process_start_time(os.getpid()))
    assert store.claimant(KEY).owner == "other" and not store.claim(KEY)
    write_claim(store)  # written before claims had a start time: the id alone decides
    assert store.claimant(KEY).owner == "other" and not store.claim(KEY)
