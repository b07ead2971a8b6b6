# torch.cuda's memory functions with every form of device a job on one GPU may pass
import torch
from _train import train

train(1)
x = torch.randn(4, device="cuda")
for device in (None, 0, "cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0),
               x.device):
    assert torch.cuda.memory_allocated(device) > 0
    assert torch.cuda.max_memory_reserved(device=device) > 0
    assert torch.cuda.mem_get_info(device)[0] > 0
    assert torch.cuda.memory_stats(device)["allocated_bytes.all.current"] > 0
    torch.cuda.reset_peak_memory_stats(device)
assert "PyTorch CUDA memory summary" in torch.cuda.memory_summary(0, abbreviated=True)
torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                         max_entries=1000)
torch.cuda.memory._record_memory_history(enabled=None)
torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=10)
print("ok")
