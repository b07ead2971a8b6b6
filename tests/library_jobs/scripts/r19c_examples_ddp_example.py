# ruff: noqa
"""pytorch/examples distributed/ddp/example.py, re-created in its upstream structure (the
torch.accelerator version its README shows, pytorch/examples main, 2025): `spmd_main()` reads
the rendezvous from torchrun's environment, picks the backend with
`torch.distributed.get_default_backend_for_device(torch.accelerator.current_accelerator())`,
sets the device with `torch.accelerator.set_device_index(rank)` and runs one DDP step of the
ToyModel, whose input is left on the host (DDP moves it to `device_ids[0]`).

Launched as upstream's README does: `torchrun --nnodes=1 --nproc_per_node=8 example.py`.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank):
    print(
        f"[{os.getpid()}] rank = {dist.get_rank()}, "
        + f"world_size = {dist.get_world_size()}"
    )

    model = ToyModel().to(rank)
    ddp_model = DDP(model, device_ids=[rank])

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(rank)
    loss_fn(outputs, labels).backward()
    optimizer.step()


def spmd_main():
    # These are the parameters used to initialize the process group
    env_dict = {
        key: os.environ[key]
        for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    }
    rank = int(env_dict['RANK'])
    local_rank = int(os.environ['LOCAL_RANK'])
    local_world_size = int(os.environ['LOCAL_WORLD_SIZE'])

    print(f"[{os.getpid()}] Initializing process group with: {env_dict}")
    acc = torch.accelerator.current_accelerator()
    vendor_backend = torch.distributed.get_default_backend_for_device(acc)
    torch.accelerator.set_device_index(rank)
    torch.distributed.init_process_group(backend=vendor_backend)

    print(
        f"[{os.getpid()}]: world_size = {dist.get_world_size()}, "
        + f"rank = {dist.get_rank()}, backend={dist.get_backend()}, "
        + f"local_rank = {local_rank}, local_world_size = {local_world_size}"
    )

    demo_basic(rank)

    # Tear down the process group
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    spmd_main()
