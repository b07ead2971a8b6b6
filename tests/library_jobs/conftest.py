from __future__ import annotations

from pathlib import Path

import pytest

from tests.library_jobs.harness import stop_warm, write_llama_checkpoint


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory) -> Path:
    """A tiny LlamaForCausalLM checkpoint directory, written before the estimate that loads it."""
    return write_llama_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session", autouse=True)
def warm_job_process():
    """The warm job process `harness.estimate` starts on first use is stopped with the session."""
    yield
    stop_warm()
