# ruff: noqa: SIM118, SIM300  (kept as sophia.py writes it)
"""Liuhong99/Sophia train_sophiag.py (nanoGPT with the SophiaG optimizer of sophia.py): AdamW's
loop with `SophiaG(optim_groups, lr, betas=(0.965, 0.99), rho, weight_decay)` (state: `step`
on the host, `exp_avg`, `hessian`), and every `hess_interval` iterations, after the optimizer
step, a Gauss-Newton-Bartlett Hessian estimate: logits of the batch, labels sampled from
`torch.distributions.Categorical(logits=logits)`, the cross-entropy on them backpropagated,
`optimizer.update_hessian()` (an EMA of grad * grad into `state['hessian']`, outside
`step`), `zero_grad(set_to_none=True)`. The model is nanogpt_train.py's (its forward takes
the targets: the sampled pass passes Y and keeps the logits)."""

import argparse
import math
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from nanogpt_train import GPT, GPTConfig
from torch.optim.optimizer import Optimizer


# sophia.py ---------------------------------------------------------------------------------------
class SophiaG(Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.965, 0.99), rho=0.04, weight_decay=1e-1, *,
                 maximize: bool = False, capturable: bool = False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        defaults = dict(lr=lr, betas=betas, rho=rho, weight_decay=weight_decay,
                        maximize=maximize, capturable=capturable)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("maximize", False)
            group.setdefault("capturable", False)

    def _init_state(self, p, state):
        state["step"] = (torch.zeros((1,), dtype=torch.float, device=p.device)
                         if self.defaults["capturable"] else torch.tensor(0.0))
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    @torch.no_grad()
    def update_hessian(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state)
                if "hessian" not in state.keys():
                    state["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["hessian"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)

    @torch.no_grad()
    def step(self, closure=None, bs=5120):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if not group["maximize"] else -p.grad
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state)
                if "hessian" not in state.keys():
                    state["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                exp_avg, hess, step_t = state["exp_avg"], state["hessian"], state["step"]
                step_t += 1
                p.mul_(1 - group["lr"] * group["weight_decay"])
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                step_size_neg = -group["lr"]
                ratio = (exp_avg.abs() / (group["rho"] * bs * hess + 1e-15)).clamp(None, 1)
                p.addcmul_(exp_avg.sign(), ratio, value=step_size_neg)
        return loss


# train_sophiag.py --------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--max-iters", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--hess-interval", type=int, default=2)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()

    device, device_type = "cuda", "cuda"
    torch.manual_seed(1337)
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        args.dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type,
                                                                        dtype=ptdtype)

    def get_batch():
        data = np.memmap(args.data, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
        x = torch.stack([torch.from_numpy(data[i:i + args.block_size].astype(np.int64))
                         for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block_size].astype(np.int64))
                         for i in ix])
        return (x.pin_memory().to(device, non_blocking=True),
                y.pin_memory().to(device, non_blocking=True))

    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=args.block_size, bias=True,
                          vocab_size=512, dropout=0.0))
    model.to(device)
    scaler = torch.cuda.amp.GradScaler(enabled=(args.dtype == "float16"))
    param_dict = {pn: p for pn, p in model.named_parameters() if p.requires_grad}
    optim_groups = [
        {"params": [p for p in param_dict.values() if p.dim() >= 2], "weight_decay": 0.2},
        {"params": [p for p in param_dict.values() if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = SophiaG(optim_groups, lr=3e-4, betas=(0.965, 0.99), rho=0.05, weight_decay=0.2)

    def get_lr(it, warmup_iters=2, lr_decay_iters=10, learning_rate=3e-4, min_lr=1.5e-5):
        if it < warmup_iters:
            return learning_rate * it / warmup_iters
        decay_ratio = min(1.0, (it - warmup_iters) / (lr_decay_iters - warmup_iters))
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)

    X, Y = get_batch()
    iter_num = 0
    while True:
        for param_group in optimizer.param_groups:
            param_group["lr"] = get_lr(iter_num)
        for _micro_step in range(args.gradient_accumulation_steps):
            with ctx:
                logits, loss = model(X, Y)
            X, Y = get_batch()
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer, bs=args.batch_size * args.block_size)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        if iter_num % args.hess_interval == args.hess_interval - 1:
            # update hessian EMA
            with ctx:
                logits, _ = model(X, Y)
                samp_dist = torch.distributions.Categorical(logits=logits)
                y_sample = samp_dist.sample()
                loss_sampled = F.cross_entropy(logits.view(-1, logits.size(-1)),
                                               y_sample.view(-1), ignore_index=-1)
            loss_sampled.backward()
            optimizer.update_hessian()
            optimizer.zero_grad(set_to_none=True)
            model.zero_grad()
            print(f"iter {iter_num}: hessian updated")
        print(f"iter {iter_num}: loss {loss.item():.4f}")
        iter_num += 1
        if iter_num > args.max_iters:
            break


if __name__ == "__main__":
    main()
