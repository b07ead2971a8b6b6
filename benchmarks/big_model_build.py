"""A big Llama built on the HOST then moved: `LlamaForCausalLM(cfg).to("cuda", dtype=bf16)`,
AdamW, one step at batch 1 x seq 2048 (the common way big-model jobs are written).

Run under peakmem (docs/capture.md, "Models built on the host; loading weights"):

    PYTHONPATH=src /usr/bin/time -v python -m peakmem estimate --gpu h100-80gb --steps 1 --json \
        -- python benchmarks/big_model_build.py --size 8b

Sizes: 8b (Llama-3-8B: hidden 4096, 32 layers, 32 heads, 8 kv heads, intermediate 14336, vocab
128256) and 70b (hidden 8192, 80 layers, 64 heads, 8 kv, intermediate 28672).
"""

from __future__ import annotations

import argparse

import torch

SIZES = {
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336),
    "70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, intermediate_size=28672),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128),
}


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="8b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    cfg = LlamaConfig(vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                      **SIZES[args.size])
    model = LlamaForCausalLM(cfg).to("cuda", dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {params} ({params * 2 / 2**30:.2f} GiB in bf16)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len), device="cuda")
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
