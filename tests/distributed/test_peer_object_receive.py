"""An object another rank sends (`dist.recv_object_list`) cannot arrive under the fake process
group: the capture stops with one line naming what needed it (torch.distributed.pipelining's
shape exchange), not with the job's unpickling error or a wrong estimate."""

import torch

from peakmem.capture import Unsupported, capture_callable
from tests.distributed.test_ddp import set_world


def test_recv_object_list_stops_the_capture_with_one_line(monkeypatch, a100, stack24):
    set_world(monkeypatch, 2, rank=1)
    received = []

    def job():
        import torch.distributed as dist

        dist.init_process_group("nccl")
        box = [None]
        dist.recv_object_list(box, src=0)
        received.append(box[0])  # not reached

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert isinstance(result.error, Unsupported) and received == []
    assert "receiving a Python object from another rank" in str(result.error)
    assert "from rank 0" in str(result.error) and "\n" not in str(result.error)


def test_pipeline_stage_names_pipeline_parallelism(monkeypatch, a100, stack24):
    # rank 0 of a two-stage pipeline: its first schedule step runs the stage's metadata
    # inference, which waits for the next stage's gradient shapes
    set_world(monkeypatch, 2, rank=0)
    steps = []

    def job():
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        dist.init_process_group("nccl")
        stage = PipelineStage(torch.nn.Linear(8, 8).cuda(), 0, 2, torch.device("cuda", 0))
        schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=torch.nn.MSELoss())
        schedule.step(torch.ones(4, 8, device="cuda"))
        steps.append(1)  # not reached

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert isinstance(result.error, Unsupported) and steps == []
    message = str(result.error)
    assert message.startswith("peakmem does not support pipeline parallelism across ranks")
    assert "torch.distributed.pipelining" in message and "from rank 1" in message
