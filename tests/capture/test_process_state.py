"""Process-wide state a job changes is put back after an in-process capture (capture.process_state):
the next job in the same process (a bench worker, `peakmem fit`'s probes) starts from the same
state. Both cases were seen as failures of later tests in one pytest worker."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peakmem.estimate import estimate_command

TF32_JOB = """\
import torch
torch.backends.cuda.matmul.allow_tf32 = True   # the legacy API (nanoGPT)
torch.backends.cuda.matmul.fp32_precision = "tf32"   # and the new one, for one backend only
torch.backends.cudnn.conv.fp32_precision = "ieee"
torch.set_float32_matmul_precision("medium")
model = torch.nn.Linear(64, 64).cuda()
model(torch.randn(8, 64, device="cuda")).sum().backward()
"""

BNB_JOB = """\
import torch
import bitsandbytes as bnb
model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 64)).cuda()
manager = bnb.optim.GlobalOptimManager.get_instance()
manager.register_module_override(model[0], "weight", {"optim_bits": 32})  # as the HF Trainer does
opt = bnb.optim.Adam8bit(model.parameters())
model(torch.arange(8, device="cuda")).sum().backward()
opt.step()
"""

ACCELERATE_JOB = """\
import sys
import torch
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision=sys.argv[1])
model, opt = accelerator.prepare(torch.nn.Linear(64, 64), torch.optim.SGD([torch.zeros(1)]))
with accelerator.autocast():
    loss = model(torch.randn(8, 64, device=accelerator.device)).sum()
accelerator.backward(loss)
"""


LOGGING_JOB = """\
import logging
import torch
logging.basicConfig(level=logging.DEBUG, filename="job.log")  # as Hydra's job logging does
logging.getLogger(__name__).info("training")
model = torch.nn.Linear(64, 64).cuda()
model(torch.randn(8, 64, device="cuda")).sum().backward()
"""


def _estimate(tmp_path: Path, monkeypatch, text: str, *args: str) -> None:
    (tmp_path / "job.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "job.py", *args], gpu="a100-40gb", mode="fake",
                              timeout=120, isolate=False)
    assert result.estimate_kind, result


def test_float32_precision_flags_are_put_back(tmp_path: Path, monkeypatch):
    before = torch.get_float32_matmul_precision()
    conv = torch.backends.cudnn.conv.fp32_precision
    _estimate(tmp_path, monkeypatch, TF32_JOB)
    # a mix of the legacy and new APIs left behind makes this read raise (Lightning reads it)
    assert torch.get_float32_matmul_precision() == before
    assert torch.backends.cudnn.conv.fp32_precision == conv


def test_bitsandbytes_overrides_do_not_outlive_the_job(tmp_path: Path, monkeypatch):
    bnb = pytest.importorskip("bitsandbytes")
    _estimate(tmp_path, monkeypatch, BNB_JOB)
    manager = bnb.optim.GlobalOptimManager.get_instance()
    # overrides are keyed by id(param): a later job's parameters reusing those ids would get
    # 32-bit states
    assert manager.pid2config == {} and manager.index2config == {}


CUDNN_JOB = """\
import torch
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True
model = torch.nn.Conv2d(3, 8, 3).cuda()
model(torch.randn(2, 3, 16, 16, device="cuda")).sum().backward()
"""


def test_cudnn_flags_are_put_back(tmp_path: Path, monkeypatch):
    """Kept by capture/runner.py (the job's backend flags saved around its run)."""
    cudnn = torch.backends.cudnn
    before = (cudnn.benchmark, cudnn.deterministic, cudnn.enabled)
    assert before[:2] == (False, False)  # torch's defaults, what the job changes
    _estimate(tmp_path, monkeypatch, CUDNN_JOB)
    assert (cudnn.benchmark, cudnn.deterministic, cudnn.enabled) == before
def test_accelerate_shared_states_do_not_outlive_the_job(tmp_path: Path, monkeypatch):
    state = pytest.importorskip("accelerate.state")
    before = {name: dict(getattr(state, name)._shared_state)
              for name in ("PartialState", "AcceleratorState", "GradientState")}
    _estimate(tmp_path, monkeypatch, ACCELERATE_JOB, "no")
    # AcceleratorState kept mixed_precision "no": the next job asking for bf16 raised
    # "AcceleratorState has already been initialized and cannot be changed"
    _estimate(tmp_path, monkeypatch, ACCELERATE_JOB, "bf16")
    assert {name: getattr(state, name)._shared_state for name in before} == before


def test_the_root_loggers_handlers_and_level_are_put_back(tmp_path: Path, monkeypatch):
    import logging

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    monkeypatch.setattr(root, "handlers", [])  # basicConfig does nothing where handlers exist
    _estimate(tmp_path, monkeypatch, LOGGING_JOB)
    assert "training" in (tmp_path / "job.log").read_text()
    # the job's file handler is gone (and closed), the level is the one before
    assert root.handlers == [] and root.level == level
    monkeypatch.undo()
    assert root.handlers == handlers


def test_logger_levels_put_back_with_one_cache_clear(monkeypatch):
    """Every logger's level is put back (set by the job with `setLevel`, assigned directly, a
    logger the job made), the level caches are valid afterwards, and they are cleared once, not
    once per logger (each `setLevel` loops over every logger: quadratic in a bench worker)."""
    import logging

    from peakmem.capture.process_state import _root_logger

    names = [f"peakmem_test_levels.l{i}" for i in range(50)]
    for i, name in enumerate(names):
        logging.getLogger(name).setLevel(logging.WARNING if i % 2 else logging.NOTSET)
    parent = logging.getLogger("peakmem_test_levels")
    parent.setLevel(logging.ERROR)
    before = {name: logging.getLogger(name).level for name in names}
    restore = _root_logger()

    # the job: one level set properly, one assigned behind the cache's back, a new logger
    logging.getLogger(names[0]).setLevel(logging.DEBUG)
    assert logging.getLogger(names[0]).isEnabledFor(logging.DEBUG)  # cached: True
    logging.getLogger(names[1]).level = logging.DEBUG
    new = logging.getLogger("peakmem_test_levels.new")
    new.setLevel(logging.INFO)
    parent.level = logging.DEBUG  # assigned: the children's caches are not cleared
    assert logging.getLogger(names[2]).isEnabledFor(logging.DEBUG)  # cached: True
    parent.level = logging.ERROR  # put back by the job itself, still without a cache clear

    clears = []
    manager = logging.getLogger().manager
    real_clear = manager._clear_cache
    monkeypatch.setattr(manager, "_clear_cache", lambda: (clears.append(1), real_clear()))
    restore()

    assert {name: logging.getLogger(name).level for name in names} == before
    assert new.level == logging.NOTSET and parent.level == logging.ERROR
    assert not logging.getLogger(names[0]).isEnabledFor(logging.DEBUG)
    assert not logging.getLogger(names[2]).isEnabledFor(logging.DEBUG)  # stale cache cleared
    assert 1 <= len(clears) <= 4  # the loggers that changed and one final clear, not 50


def test_loggers_levels_are_put_back_with_one_pass_over_the_loggers(monkeypatch):
    """Every logger's level is put back, and the isEnabledFor caches emptied, with a bounded
    number of passes over the loggers: a `setLevel` per logger (each one emptying every
    logger's cache) made the restore quadratic, ~0.3 s a capture in a process that had imported
    transformers, DeepSpeed and diffusers (docs/DEVELOPMENT.md, suite time)."""
    import logging

    from peakmem.capture import process_state

    names = [f"peakmem-test-levels.{i}" for i in range(40)]
    loggers = [logging.getLogger(name) for name in names]
    try:
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        restore = process_state._root_logger()
        for logger in loggers:  # the job: every logger at DEBUG (open_clip_train sets INFO)
            logger.setLevel(logging.DEBUG)
            assert logger.isEnabledFor(logging.DEBUG)  # cached from now on
        passes = []
        clear = logging.Manager._clear_cache
        monkeypatch.setattr(logging.Manager, "_clear_cache",
                            lambda self: (passes.append(1), clear(self))[1])
        restore()
        assert [logger.level for logger in loggers] == [logging.WARNING] * len(loggers)
        # the caches were emptied: the level put back is the one isEnabledFor answers by
        assert not any(logger.isEnabledFor(logging.DEBUG) for logger in loggers)
        assert len(passes) <= 2
    finally:
        for name in names:
            logging.Logger.manager.loggerDict.pop(name, None)
        logging.Logger.manager.loggerDict.pop("peakmem-test-levels", None)


DETERMINISTIC_JOB = """\
import torch
torch.use_deterministic_algorithms(True, warn_only=True)   # the DCGAN tutorial (without warn_only)
model = torch.nn.Conv2d(3, 8, 3).cuda()
model(torch.randn(2, 3, 16, 16, device="cuda")).sum().backward()
"""


def test_deterministic_algorithms_switch_is_put_back(tmp_path: Path, monkeypatch):
    """Left on, the next in-process job's first matmul raised (no CUBLAS_WORKSPACE_CONFIG)."""
    assert not torch.are_deterministic_algorithms_enabled()
    _estimate(tmp_path, monkeypatch, DETERMINISTIC_JOB)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
