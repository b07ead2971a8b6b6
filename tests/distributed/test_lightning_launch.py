"""Lightning's own multi-GPU launch run as plain `python train.py` (capture/lightning_launch.py):
rank 0 of the world Lightning would start is traced, and `--json` says so like torchrun's."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch

from tests.distributed.test_cli_distributed import cli

TRAIN = """
    import os, sys
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                           torch.nn.Linear(256, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(torch.randn(64, 64), torch.randint(0, 10, (64,)))
    trainer = L.Trainer(accelerator="gpu", devices=int(sys.argv[2]), strategy=sys.argv[1],
                        max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Net(), DataLoader(data, batch_size=8))
    print(f"world {trainer.world_size} rank {trainer.global_rank} "
          f"devices {torch.cuda.device_count()} local {os.environ.get('LOCAL_RANK')}", flush=True)
"""


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "ddp_spawn"])
def test_trainer_devices_n_traces_rank_zero_of_n(tmp_path, strategy):
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    result = cli(tmp_path, "--json", "--mode", "fake", "--", "python", "train.py", strategy, "4")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["launcher"] == "lightning"
    assert data["world_size"] == 4 and data["nproc_per_node"] == 4 and data["nnodes"] == 1
    assert data["traced_ranks"] == [0] and data["largest_rank"] == 0
    assert [row["rank"] for row in data["ranks"]] == [0]
    assert data["ranks"][0]["peak_bytes"] == data["peak_bytes"]
    assert data["libraries"]["nccl"] > 0
    assert "world 4 rank 0 devices 4 local 0" in result.stderr, result.stderr[-3000:]
    assert any("Lightning would start 4 process(es)" in note for note in data["notes"])


def test_a_one_device_trainer_is_not_a_launch(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    result = cli(tmp_path, "--json", "--mode", "fake", "--", "python", "train.py", "auto", "1")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert "world_size" not in data and "ranks" not in data
    assert "world 1 rank 0 devices 1" in result.stderr


def test_the_environment_and_device_count_are_put_back(monkeypatch):
    """In-process: what adopting rank 0 changed is undone when the capture ends."""
    from peakmem.capture.lightning_launch import _adopt_rank_zero, _Adopted

    class Cluster:
        main_address, main_port, creates_processes_externally = "10.0.0.1", 1234, False

    class Launcher:
        num_processes, num_nodes, cluster_environment = 3, 2, Cluster()

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("MASTER_PORT", "999")
    count = torch.cuda.device_count
    adopted = _Adopted()
    _adopt_rank_zero(Launcher(), adopted)
    assert os.environ["WORLD_SIZE"] == "6" and os.environ["LOCAL_WORLD_SIZE"] == "3"
    assert os.environ["LOCAL_RANK"] == "0" and os.environ["MASTER_ADDR"] == "10.0.0.1"
    assert torch.cuda.device_count() == 3
    adopted.restore()
    assert "LOCAL_RANK" not in os.environ and os.environ["MASTER_PORT"] == "999"
    assert torch.cuda.device_count is count


def test_a_self_launch_is_read_only_from_well_formed_meta():
    from peakmem.capture.result import CaptureResult
    from peakmem.estimate.distributed import self_launch
    from peakmem.trace.events import Trace

    def capture(meta):
        return CaptureResult(trace=Trace(meta=meta), steps=0, stopped=False, forward_calls=0,
                             seconds=0)

    good = {"launcher": "lightning", "world_size": 8, "nproc_per_node": 4, "nnodes": 2}
    launch = self_launch(capture({"launch": good}), ["python", "train.py"])
    assert launch is not None and launch.world_size == 8 and launch.launcher == "lightning"
    assert launch.command == ("python", "train.py")
    for bad in ({**good, "world_size": 6}, {**good, "launcher": "torchrun"},
                {**good, "nnodes": True}, {**good, "nproc_per_node": 0}, "lightning"):
        assert self_launch(capture({"launch": bad}), ["python", "train.py"]) is None
    assert self_launch(capture({}), ["python", "train.py"]) is None


FABRIC = """
    import lightning as L
    import torch

    fabric = L.Fabric(accelerator="cuda", devices=2, strategy="ddp")
    fabric.launch()
    print(f"fabric world {fabric.world_size} rank {fabric.global_rank}", flush=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    for _ in range(2):
        fabric.backward(model(torch.randn(8, 64, device=fabric.device)).sum())
        optimizer.step()
        optimizer.zero_grad()
"""


def test_fabric_devices_n_traces_rank_zero_of_n(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(FABRIC))
    result = cli(tmp_path, "--json", "--mode", "fake", "--", "python", "train.py")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["launcher"] == "lightning" and data["world_size"] == 2
    assert data["traced_ranks"] == [0] and data["libraries"]["nccl"] > 0
    assert "fabric world 2 rank 0" in result.stderr
