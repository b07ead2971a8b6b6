"""pytorch/examples distributed/FSDP2 (example.py, model.py, checkpoint.py), re-created in one
file: `torchrun --nproc_per_node 2 r6_fsdp2_example.py [--mixed-precision]
[--explicit-prefetching]`. A toy nanoGPT-like Transformer (ModelArgs: 10 layers, 4 heads, vocab
1024, 64 positions, dim 16, no dropout) is built on the meta device, each TransformerBlock and
then the root are `fully_shard`ed (MixedPrecisionPolicy(bf16 params, fp32 reduce) with
--mixed-precision), materialised with `to_empty` + `reset_parameters`, trained 10 steps of Adam
(lr 1e-2) with gradient-norm clipping on random tokens (batch 32 x 64), and the full model and
optimizer state dicts are gathered (`DTensor.full_tensor()`) and saved by rank 0 under
checkpoints/dtensor_api/<time>/ (the example's first run: no checkpoint to load)."""

import argparse
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class ModelArgs:
    n_layers: int = 2
    vocab_size: int = 8
    max_seq_len: int = 16
    dim: int = 16
    n_heads: int = 4
    dropout_p: float = 0.1


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads, self.head_dim, self.dropout_p = args.n_heads, args.dim // args.n_heads, args.dropout_p
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(args.dim, args.dim, bias=False) for _ in range(4))
        self.resid_dropout = nn.Dropout(args.dropout_p)

    def forward(self, x):
        batch, seq, _ = x.shape

        def heads(t):
            return t.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x)), None,
                                             self.dropout_p if self.training else 0)
        return self.resid_dropout(self.wo(out.transpose(1, 2).contiguous().view(batch, seq, -1)))

    def reset_parameters(self):
        for linear in (self.wq, self.wk, self.wv, self.wo):
            linear.reset_parameters()


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, dropout_p):
        super().__init__()
        self.w1, self.gelu, self.w2 = nn.Linear(dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, dim)
        self.resid_dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        return self.resid_dropout(self.w2(self.gelu(self.w1(x))))

    def reset_parameters(self):
        self.w1.reset_parameters()
        self.w2.reset_parameters()


class TransformerBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(args.dim), Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim, args.dropout_p)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))

    def reset_parameters(self):
        for module in (self.attention_norm, self.attention, self.ffn_norm, self.feed_forward):
            module.reset_parameters()


class Transformer(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.dropout = nn.Dropout(args.dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        h = self.dropout(h)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()

    def reset_parameters(self):
        for module in (self.tok_embeddings, self.pos_embeddings, self.norm, self.output):
            module.reset_parameters()


def prefetch(model, count, forward):
    layers = list(model.layers)
    for i, layer in enumerate(layers):
        targets = layers[i + 1:i + 1 + count] if forward else layers[max(0, i - count):i][::-1]
        if targets:
            (layer.set_modules_to_forward_prefetch if forward else layer.set_modules_to_backward_prefetch)(targets)


def full_state(model, optim, rank):
    """checkpoint.py's dtensor_api save: every rank gathers, rank 0 keeps host copies."""
    model_sd = {}
    for name, sharded in model.state_dict().items():
        full = sharded.full_tensor()
        if rank == 0:
            model_sd[name] = full.cpu()
    optim_sd = optim.state_dict()
    state = {}
    for key, per_param in optim_sd["state"].items():
        gathered = {}
        for attr, value in per_param.items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if rank == 0:
                gathered[attr] = full.cpu()
        state[key] = gathered
    return model_sd, {"param_groups": optim_sd["param_groups"], "state": state}


def main(args):
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"{torch.accelerator.current_accelerator()}:{rank}")
    torch.accelerator.set_device_index(rank)
    torch.distributed.init_process_group(backend=torch.distributed.get_default_backend_for_device(device),
                                         device_id=device)
    torch.manual_seed(0)
    vocab_size, batch_size, seq_len = 1024, 32, 64
    with torch.device("meta"):
        model = Transformer(ModelArgs(n_layers=10, n_heads=4, vocab_size=vocab_size, max_seq_len=seq_len,
                                      dropout_p=0))
    kwargs = {}
    if args.mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if args.explicit_prefetching:
        prefetch(model, 2, forward=True)
        prefetch(model, 2, forward=False)
    model.to_empty(device=device)
    model.reset_parameters()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(10):
        if args.explicit_prefetching:
            model.unshard()
        x = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
        loss = model(x).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
    model_sd, optim_sd = full_state(model, optim, torch.distributed.get_rank())
    if torch.distributed.get_rank() == 0:
        folder = f"checkpoints/dtensor_api/{int(time.time() * 1000)}"
        os.makedirs(folder, exist_ok=True)
        torch.save(model_sd, f"{folder}/model_state_dict.pt")
        torch.save(optim_sd, f"{folder}/optim_state_dict.pt")
        print(f"saved {len(model_sd)} tensors and the state of {len(optim_sd['state'])} parameters")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="PyTorch FSDP2 example")
    parser.add_argument("--explicit-prefetching", action="store_true")
    parser.add_argument("--mixed-precision", action="store_true")
    main(parser.parse_args())
