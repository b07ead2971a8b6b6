"""torchtitan's published Llama 3.1 8B FSDP2 memory, estimated by peakmem rank by rank.

The published figures (torchtitan docs/performance.md, torch 1963fc8 2024/12/23, torchtitan
9dec370, H100 96 GB HBM2e): Llama 3.1 8B, 1D FSDP, local batch size 2, sequence length 8192,
selective (op) activation checkpointing, bf16 parameters / fp32 gradient reduction, AdamW;
"Memory(GiB)" is torchtitan's peak reserved memory (`reserved_bytes.all.peak`), stable over the
run: 82.4 GiB on 8 GPUs (Table 1, FSDP row) and 67.0 GiB on 128 GPUs (Table 3, FSDP row).

torchtitan is not installed here: `--job` runs a plain FSDP2 script rebuilt from its recipe
(the same model, per-block `fully_shard` with the last block not resharded after forward,
the mixed-precision policy, selective op checkpointing saving every other matmul and the
attention outputs, the fp32 cross-entropy over the logits, gradient clipping, foreach AdamW).
The model is built on the host (kept fake by the capture: no host memory) and `fully_shard`
moves each rank's shards to the device, so no rank ever holds the full model (torchtitan
builds it on meta and materialises the shards: the same device memory).

    PYTHONPATH=src python benchmarks/distributed/torchtitan_llama3.py [--world 8 128]
        [--without fake_streams|storage_resize]

prints, per world size, rank 0's estimated peak reserved memory (the trace replayed on the
H200 profile only for its capacity: 82.4 GiB does not fit the 80 GB H100 profile, and the
reserved peak does not depend on the capacity when nothing runs out) next to the published one.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

PUBLISHED_GIB = {8: 82.4, 128: 67.0}
"""torchtitan docs/performance.md, Tables 1 and 3, FSDP rows (Memory(GiB))."""
GIB = 2**30


# -- the job: torchtitan's Llama 3.1 8B recipe as a plain FSDP2 script ------------------------


def job(argv: list[str]) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    def ffn_hidden(dim: int, multiple_of: int = 1024, multiplier: float = 1.3) -> int:
        hidden = int(multiplier * int(2 * 4 * dim / 3))
        return multiple_of * ((hidden + multiple_of - 1) // multiple_of)

    def rope(dim: int, end: int, theta: float = 500000.0) -> torch.Tensor:
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        angles = torch.outer(torch.arange(end, device=freqs.device).float(), freqs)
        return torch.polar(torch.ones_like(angles), angles)  # complex64

    def apply_rope(xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs = freqs.view(1, xq_.shape[1], 1, xq_.shape[-1])
        xq_out = torch.view_as_real(xq_ * freqs).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head_dim = args.dim // args.heads
            self.wq = nn.Linear(args.dim, args.heads * self.head_dim, bias=False)
            self.wk = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
            self.wv = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
            self.wo = nn.Linear(args.heads * self.head_dim, args.dim, bias=False)

        def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
            bs, seq, _ = x.shape
            xq = self.wq(x).view(bs, seq, args.heads, self.head_dim)
            xk = self.wk(x).view(bs, seq, args.kv_heads, self.head_dim)
            xv = self.wv(x).view(bs, seq, args.kv_heads, self.head_dim)
            xq, xk = apply_rope(xq, xk, freqs)
            repeats = args.heads // args.kv_heads
            keys = xk.unsqueeze(3).expand(bs, seq, args.kv_heads, repeats, self.head_dim)
            values = xv.unsqueeze(3).expand(bs, seq, args.kv_heads, repeats, self.head_dim)
            keys = keys.reshape(bs, seq, args.heads, self.head_dim)
            values = values.reshape(bs, seq, args.heads, self.head_dim)
            out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2),
                                                 values.transpose(1, 2), is_causal=True)
            return self.wo(out.transpose(1, 2).contiguous().view(bs, seq, -1))

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            hidden = ffn_hidden(args.dim)
            self.w1 = nn.Linear(args.dim, hidden, bias=False)
            self.w2 = nn.Linear(hidden, args.dim, bias=False)
            self.w3 = nn.Linear(args.dim, hidden, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = Attention()
            self.feed_forward = FeedForward()
            self.attention_norm = nn.RMSNorm(args.dim, eps=1e-5)
            self.ffn_norm = nn.RMSNorm(args.dim, eps=1e-5)

        def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
            h = x + self.attention(self.attention_norm(x), freqs)
            return h + self.feed_forward(self.ffn_norm(h))

    save_ops = {
        torch.ops.aten.mm.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten.max.default,
    }

    def policy():
        counts = {"forward": 0, "recompute": 0}

        def choose(ctx, func, *args, **kwargs):
            key = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                counts[key] += 1
            save = func in save_ops and not (
                func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(choose)

    class Checkpointed(nn.Module):
        """torchtitan's selective op activation checkpointing of one block."""

        def __init__(self, block: nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.block, x, freqs, use_reentrant=False, context_fn=policy,
                              preserve_rng_state=False)

    class Transformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_embeddings = nn.Embedding(args.vocab, args.dim)
            self.register_buffer("freqs_cis", rope(args.dim // args.heads, args.seq * 2),
                                 persistent=True)
            self.layers = nn.ModuleList(Checkpointed(Block()) for _ in range(args.layers))
            self.norm = nn.RMSNorm(args.dim, eps=1e-5)
            self.output = nn.Linear(args.dim, args.vocab, bias=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.tok_embeddings(tokens)
            freqs = self.freqs_cis[: tokens.shape[1]]
            for layer in self.layers:
                h = layer(h, freqs)
            return self.output(self.norm(h))

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(__import__("os").environ.get("LOCAL_RANK", 0)))
    model = Transformer()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for index, layer in enumerate(model.layers):
        fully_shard(layer, mp_policy=mp, reshard_after_forward=index < len(model.layers) - 1)
    fully_shard(model, mp_policy=mp, reshard_after_forward=True)
    model.freqs_cis = model.freqs_cis.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-5, eps=1e-8, weight_decay=0.1,
                                  foreach=True)
    for _ in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
        labels = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
        del logits
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad()
    print(f"peak reserved (the job's own reading): "
          f"{torch.cuda.max_memory_reserved() / GIB:.2f} GiB", flush=True)


# -- the driver -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, nargs="+", default=[8])
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--torch-version", default="2.6")
    parser.add_argument("--without", choices=("fake_streams", "storage_resize"), default=None,
                        help="ablation: capture without that fake-runtime module (in this "
                        "process, isolate=False)")
    parser.add_argument("--job-args", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args()

    from peakmem.estimate import estimate_command

    if args.without:
        from peakmem.capture import fake_cuda

        providers = fake_cuda.patch_providers
        module = f"peakmem.capture.{args.without}"
        fake_cuda.patch_providers = lambda: [p for p in providers() if p.__module__ != module]

    command = [sys.executable, str(Path(__file__).resolve()), "--job", *args.job_args]
    print(f"{'GPUs':>5} {'published GiB':>14} {'peakmem GiB':>12} {'error':>7} {'seconds':>8}")
    for world in args.world:
        started = time.monotonic()
        result = estimate_command(command, gpu=args.gpu, torch_version=args.torch_version,
                                  mode="fake", steps=3, nproc_per_node=min(world, 8),
                                  nnodes=max(1, math.ceil(world / 8)),
                                  isolate=args.without is None)
        ours = result.peak_reserved_bytes / GIB
        published = PUBLISHED_GIB.get(world)
        error = f"{100 * (ours - published) / published:+.1f}%" if published else "-"
        print(f"{world:>5} {published if published else '-':>14} {ours:>12.2f} {error:>7} "
              f"{time.monotonic() - started:>8.0f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:
        job(sys.argv[2:])
    else:
        main()
