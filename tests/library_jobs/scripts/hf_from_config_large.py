"""run_clm.py "train from scratch" style: AutoModelForCausalLM.from_config on the host (fp32
weights initialised on the CPU), then .to("cuda"). The model is sized by the flags; the test
uses one of a few hundred MB so that building it on the host shows in the estimate's RAM."""

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=16)
    args = parser.parse_args()

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"Training new model from scratch - Total size={n_params / 2**20:.2f}M params")
    model.to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (1, args.seq_len), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
