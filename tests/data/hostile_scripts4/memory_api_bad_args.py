# trains, then calls one of torch.cuda's memory functions with an argument a GPU refuses
# (argv[1] names which): the job fails as on the GPU, no estimate of a job that cannot run
import sys

import torch
from _train import train

train(1)
calls = {
    "mem_get_info": lambda: torch.cuda.mem_get_info(device=-7),
    "memory_stats": lambda: torch.cuda.memory_stats(device="cpu"),
    "memory_summary": lambda: torch.cuda.memory_summary(device=99),
    "memory_allocated": lambda: torch.cuda.memory_allocated("cuda:3"),
    "record_history": lambda: torch.cuda.memory._record_memory_history(enabled="bogus"),
    "record_history_entries": lambda: torch.cuda.memory._record_memory_history(max_entries=-5),
}
calls[sys.argv[1]]()
