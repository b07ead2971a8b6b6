"""pytorch/examples distributed/tensor_parallelism/tensor_parallel_example.py, re-created: run as
`torchrun --nproc_per_node 2 tensor_parallel_example.py`; `init_device_mesh("cuda",
(WORLD_SIZE,))`, a two-Linear ToyModel moved to "cuda", an AdamW(foreach=True) built over its
parameters *before* `parallelize_module(..., {"in_proj": ColwiseParallel(), "out_proj":
RowwiseParallel()})` (which replaces them with DTensor parameters, so that optimizer holds the
originals: they have no gradients and it never makes state), ten iterations of
forward / backward / step."""

import logging
import os

import torch
import torch.nn as nn
from torch.distributed._tensor.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

logging.basicConfig(format='%(asctime)s %(message)s', datefmt='%m/%d/%Y %I:%M:%S %p', level=logging.INFO)
logger = logging.getLogger(__name__)


class ToyModel(nn.Module):
    """ MLP based model """
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


_world_size = int(os.environ["WORLD_SIZE"])

device_mesh = init_device_mesh(device_type="cuda", mesh_shape=(_world_size,))
_rank = device_mesh.get_rank()


def rank_log(msg):
    """helper function to print only on global rank 0"""
    if _rank == 0:
        logger.info(f"  {msg}")


print(f"Starting PyTorch TP example on rank {_rank}.")
assert _world_size % 2 == 0, f"TP examples require even number of GPUs, but got {_world_size} gpus"

rank_log(f"Device Mesh created: {device_mesh=}")

tp_model = ToyModel().to("cuda")

lr = 0.25
optimizer = torch.optim.AdamW(tp_model.parameters(), lr=lr, foreach=True)

tp_model = parallelize_module(module=tp_model,
                              device_mesh=device_mesh,
                              parallelize_plan={
                                  "in_proj": ColwiseParallel(),
                                  "out_proj": RowwiseParallel(),
                              },
                              )
num_iters = 10
rank_log("Tensor Parallel training starting...")

for i in range(num_iters):
    torch.manual_seed(i)
    inp = torch.rand(20, 10, device="cuda")
    output = tp_model(inp)
    output.sum().backward()
    optimizer.step()
    rank_log(f"Tensor Parallel iter {i} completed")

rank_log("Tensor Parallel training completed!")
