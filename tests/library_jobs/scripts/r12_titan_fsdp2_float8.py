"""A torchtitan-style training step (pytorch/torchtitan: torchtitan/train.py with
parallelize_llama's apply_compile / apply_fsdp and the float8 model converter), re-created: run as
`torchrun --nproc_per_node 2 train.py`. The model is built on the meta device; float8 training
(`convert_to_float8_training` with `enable_fsdp_float8_all_gather`, every Linear but the output
projection), each TransformerBlock compiled (`torch.compile(block, fullgraph=True)`) and
`fully_shard`-ed over a 1-D "dp_shard" mesh with MixedPrecisionPolicy(bf16 params, fp32
reduce), then the root; `to_empty(device="cuda")` and `init_weights()`; AdamW (fused), cross
entropy, `clip_grad_norm_`, the step, `precompute_float8_dynamic_scale_for_fsdp`.
Tiny (dim 128, 2 layers, 4 heads, FFN 256, vocab 512, batch 4 x 64); `--no-float8`,
`--no-compile`, `--steps N`."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        bs, seqlen, _ = x.shape
        q, k, v = (w(x).view(bs, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads, hidden_dim):
        super().__init__()
        self.attention = Attention(dim, n_heads)
        self.feed_forward = FeedForward(dim, hidden_dim)
        self.attention_norm = nn.RMSNorm(dim)
        self.ffn_norm = nn.RMSNorm(dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab_size=512, dim=128, n_layers=2, n_heads=4, hidden_dim=256):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(dim, n_heads, hidden_dim)
                                     for i in range(n_layers)})
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def init_weights(self):
        nn.init.normal_(self.tok_embeddings.weight)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
            elif isinstance(module, nn.RMSNorm):
                module.reset_parameters()

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-float8", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (world_size,), mesh_dim_names=("dp_shard",))

    with torch.device("meta"):
        model = Transformer()

    if not args.no_float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
        convert_to_float8_training(model, config=config,
                                   module_filter_fn=lambda mod, fqn: fqn != "output")

    if not args.no_compile:  # apply_compile: each block, registered back in place
        for layer_id, block in model.layers.named_children():
            model.layers.register_module(layer_id, torch.compile(block, fullgraph=True))

    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer_id, block in model.layers.items():
        reshard = int(layer_id) < len(model.layers) - 1
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=True)

    model.to_empty(device="cuda")
    with torch.no_grad():
        model.init_weights()
    model.train()

    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, weight_decay=0.1, fused=True)
    for step in range(1, args.steps + 1):
        inputs = torch.randint(0, 512, (4, 64), device="cuda")
        labels = torch.randint(0, 512, (4, 64), device="cuda")
        optimizer.zero_grad()
        pred = model(inputs)
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        del pred
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        if not args.no_float8:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(model)
        if local_rank == 0:
            print(f"step: {step}  loss: {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
