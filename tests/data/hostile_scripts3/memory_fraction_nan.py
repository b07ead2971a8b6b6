# a NaN fraction passes torch's Python checks and fails the allocator's C++ TORCH_CHECK
# (RuntimeError on the GPU); the capture put NaN in the trace, and the result was refused
import torch
from _train import train

torch.cuda.set_per_process_memory_fraction(float("nan"))
train()
