"""pytorch/examples distributed/tensor_parallelism/sequence_parallel_example.py, re-created: run as
`torchrun --nproc_per_node 2 sequence_parallel_example.py`. `init_device_mesh("cuda",
(WORLD_SIZE,))`, the two-Linear ToyModel moved to "cuda", `parallelize_module` with
`ColwiseParallel(input_layouts=Shard(0))` / `RowwiseParallel(output_layouts=Shard(0))` (each
rank's input rows differ: one all-gather in, one reduce-scatter out), AdamW(foreach=True) built
after it, ten iterations of forward / backward / step."""

import logging
import os

import torch
import torch.nn as nn
from torch.distributed._tensor import Shard
from torch.distributed._tensor.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

logging.basicConfig(format='%(asctime)s %(message)s', datefmt='%m/%d/%Y %I:%M:%S %p',
                    level=logging.INFO)
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


device_mesh = init_device_mesh(device_type="cuda", mesh_shape=(int(os.environ["WORLD_SIZE"]),))
_rank = device_mesh.get_rank()


def rank_log(msg):
    """helper function to log only on global rank 0"""
    if _rank == 0:
        logger.info(f" {msg}")


print(f"Starting PyTorch Sequence Parallel example on rank {_rank}.")
rank_log(f"Device Mesh created: {device_mesh=}")

model = ToyModel().to("cuda")
sp_model = parallelize_module(module=model,
                              device_mesh=device_mesh,
                              parallelize_plan={
                                  "in_proj": ColwiseParallel(input_layouts=Shard(0)),
                                  "out_proj": RowwiseParallel(output_layouts=Shard(0)),
                              })

lr = 0.25
optimizer = torch.optim.AdamW(sp_model.parameters(), lr=lr, foreach=True)

num_iters = 10
rank_log("Sequence Parallel training starting...")
for i in range(num_iters):
    # For SP, input can be different across all ranks.
    inp = torch.rand(20, 10, device="cuda")
    output = sp_model(inp)
    output.sum().backward()
    optimizer.step()
    rank_log(f"Sequence Parallel iter {i} completed")

rank_log("Sequence Parallel training completed!")
