"""torchtune-style full fine-tune on one device (the recipe full_finetune_single_device's loop
written out: torchtune itself cannot import here): a small Llama-style decoder (RMSNorm,
rotary embeddings, SwiGLU, untied output) built in bf16 (`dtype: bf16`), activation
checkpointing of each layer, bitsandbytes' `AdamW8bit` (the recipe's low-memory optimizer),
gradient accumulation with the loss normalised by the token count, `clip_grad_norm_`, and the
recipe's memory logging (`torch.cuda.memory_stats()`, `torch.cuda.max_memory_reserved()`)."""

import argparse

import bitsandbytes as bnb
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x_fp32 = x.float()
        normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.scale).type_as(x)


def rope(x, base=10_000):
    b, s, h, d = x.shape
    theta = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device).float() / d))
    freqs = torch.outer(torch.arange(s, device=x.device).float(), theta)
    cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.output_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = rope(self.q_proj(x).view(b, s, self.heads, self.head_dim)).transpose(1, 2)
        k = rope(self.k_proj(x).view(b, s, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.output_proj(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerSelfAttentionLayer(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.sa_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = FeedForward(dim, hidden)

    def forward(self, x):
        h = x + self.attn(self.sa_norm(x))
        return h + self.mlp(self.mlp_norm(h))


class TransformerDecoder(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, hidden):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(TransformerSelfAttentionLayer(dim, heads, kv_heads, hidden)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.activation_checkpointing = False

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            if self.activation_checkpointing and self.training:
                h = checkpoint(layer, h, use_reentrant=False)
            else:
                h = layer(h)
        return self.output(self.norm(h)).float()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=704)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--enable-activation-checkpointing", action="store_true")
    args = parser.parse_args()

    device = torch.device("cuda")
    dtype = torch.bfloat16
    with torch.device(device):
        model = TransformerDecoder(args.vocab, args.dim, args.layers, args.heads, args.kv_heads,
                                   args.hidden).to(dtype)
    model.activation_checkpointing = args.enable_activation_checkpointing
    optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=2e-5, weight_decay=0.01)

    tokens = torch.randint(0, args.vocab, (args.samples, args.seq_len + 1))
    dataloader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size, shuffle=True,
                            drop_last=True)
    ignore_index = -100

    optimizer.zero_grad()
    running_loss, num_tokens = 0.0, 0
    for epoch in range(args.epochs):
        for idx, (batch,) in enumerate(dataloader):
            batch = batch.to(device)
            inputs, labels = batch[:, :-1], batch[:, 1:]
            current_num_tokens = (labels != ignore_index).sum()
            num_tokens += current_num_tokens
            logits = model(inputs)
            current_loss = F.cross_entropy(logits.reshape(-1, args.vocab), labels.reshape(-1),
                                           ignore_index=ignore_index, reduction="sum")
            running_loss += current_loss
            current_loss.backward()
            if (idx + 1) % args.gradient_accumulation_steps == 0:
                # scale the summed gradients by the token count of the window
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(1 / num_tokens)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                loss_to_log = running_loss.item() / num_tokens
                stats = torch.cuda.memory_stats()
                print(f"epoch {epoch} step {(idx + 1) // args.gradient_accumulation_steps} "
                      f"loss {loss_to_log:.4f} grad_norm {grad_norm.item():.3f} "
                      f"peak_memory_active {stats.get('active_bytes.all.peak', 0) / 2**30:.2f} GiB "
                      f"peak_memory_reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB")
                running_loss, num_tokens = 0.0, 0


if __name__ == "__main__":
    main()
