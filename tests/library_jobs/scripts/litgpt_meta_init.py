"""litgpt / torchtitan style: build the model on the meta device (no memory), materialize it on
the GPU with to_empty(device="cuda"), re-run the initializers, train in bf16 weights."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        norm = x.float().pow(2).mean(-1, keepdim=True).add(self.eps).rsqrt()
        return (x.float() * norm).type_as(x) * self.weight

    def reset_parameters(self):
        nn.init.ones_(self.weight)


class Block(nn.Module):
    def __init__(self, dim, n_head, hidden):
        super().__init__()
        self.n_head = n_head
        self.attention_norm = RMSNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Transformer(nn.Module):
    def __init__(self, vocab, dim, n_layer, n_head, hidden):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, n_head, hidden) for _ in range(n_layer)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))

    def init_weights(self):
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, RMSNorm)):
                m.reset_parameters()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=352)
    parser.add_argument("--default-device", action="store_true",
                        help="build under torch.set_default_device('meta') instead of a context")
    args = parser.parse_args()

    torch.set_default_dtype(torch.bfloat16)  # litgpt's init_module under "bf16-true"
    if args.default_device:
        torch.set_default_device("meta")
        model = Transformer(args.vocab, args.dim, args.n_layer, args.n_head, args.hidden)
        torch.set_default_device(None)
    else:
        with torch.device("meta"):
            model = Transformer(args.vocab, args.dim, args.n_layer, args.n_head, args.hidden)
    torch.set_default_dtype(torch.float32)
    model.to_empty(device="cuda")
    with torch.no_grad():
        model.init_weights()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=True)

    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), device="cuda")
        x, y = tokens[:, :-1], tokens[:, 1:]
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
