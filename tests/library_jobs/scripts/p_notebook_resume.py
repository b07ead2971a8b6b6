#!/usr/bin/env python
# coding: utf-8  # noqa: UP009  (as nbconvert writes it)
"""A notebook exported with `jupyter nbconvert --to script`, then run on a SLURM cluster: the
`get_ipython()` magics guarded, `display()`, the device picked "cuda" / "mps" / "cpu" and made
the default (`torch.set_default_device`), seeds and the RNG states saved in the checkpoint,
`torch.save` of the model's and the optimizer's state every N steps, a resume with
`torch.load(map_location="cuda")` (the loaded dict is kept, as notebooks do), SIGTERM / SIGUSR1
handlers that checkpoint and requeue, tensorboard's SummaryWriter if installed."""

# In[1]:


import argparse
import math
import os
import signal
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    get_ipython().run_line_magic("matplotlib", "inline")  # noqa: F821
    IN_NOTEBOOK = True
except NameError:
    IN_NOTEBOOK = False

try:
    from IPython.display import display
except ImportError:
    display = print

try:
    from torch.utils.tensorboard import SummaryWriter
except ImportError:
    SummaryWriter = None


# In[2]:


parser = argparse.ArgumentParser()
parser.add_argument("--out", default="checkpoints")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--save-every", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--preempt-at", type=int, default=-1, help="send ourselves SIGUSR1 then")
args = parser.parse_args([] if IN_NOTEBOOK else sys.argv[1:])

device = torch.device(
    "cuda" if torch.cuda.is_available()
    else "mps" if torch.backends.mps.is_available()
    else "cpu"
)
torch.set_default_device(device)
torch.manual_seed(1337)
torch.cuda.manual_seed_all(1337)
print(f"device: {device}")

VOCAB, DIM, HEADS, LAYERS, CONTEXT = 128, 64, 4, 2, 32


# In[3]:


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, DIM))
        layer = nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        mask = nn.Transformer.generate_square_subsequent_mask(idx.size(1), device=idx.device)
        x = self.embed(idx) + self.pos[: idx.size(1)]
        return self.head(self.blocks(x, mask=mask, is_causal=True))


model = TinyLM()  # on the default device
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
display({"parameters": sum(p.numel() for p in model.parameters()), "device": str(device)})


# In[4]:


os.makedirs(args.out, exist_ok=True)
ckpt_path = os.path.join(args.out, "last.pt")
start_step = 0
if os.path.exists(ckpt_path):
    ckpt = torch.load(ckpt_path, map_location="cuda")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["cpu_rng"].cpu())  # map_location put it on the GPU: a GPU's
    if ckpt["cuda_rng"] is not None:  # state raises "RNG state must be a torch.ByteTensor"
        torch.cuda.set_rng_state(ckpt["cuda_rng"].cpu())
    start_step = ckpt["step"]
    print(f"resumed from step {start_step}")


def save_checkpoint(step):
    torch.save({
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "cpu_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state() if device.type == "cuda" else None,
    }, ckpt_path)
    print(f"saved step {step}", flush=True)


preempted = {"signal": None}


def on_preempt(signum, frame):
    preempted["signal"] = signum


signal.signal(signal.SIGUSR1, on_preempt)
signal.signal(signal.SIGTERM, on_preempt)
writer = SummaryWriter(os.path.join(args.out, "tb")) if SummaryWriter is not None else None


# In[5]:


step = start_step
model.train()
while step < start_step + args.steps:
    idx = torch.randint(0, VOCAB, (args.batch_size, CONTEXT + 1))
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    step += 1
    if writer is not None:
        writer.add_scalar("loss", loss.item(), step)
    if step == args.preempt_at:
        os.kill(os.getpid(), signal.SIGUSR1)
    if preempted["signal"] is not None:
        save_checkpoint(step)
        print(f"signal {preempted['signal']} at step {step}: checkpointed", flush=True)
        if "SLURM_JOB_ID" in os.environ:
            os.system(f"scontrol requeue {os.environ['SLURM_JOB_ID']}")
        break
    if step % args.save_every == 0:
        save_checkpoint(step)
print(f"step {step} loss {loss.item():.3f} (uniform {math.log(VOCAB):.3f}), "
      f"max allocated {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
