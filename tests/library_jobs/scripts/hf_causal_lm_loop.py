"""A plain PyTorch loop around a Hugging Face causal LM built from a config (no download).

Style of the transformers docs' "train in native PyTorch" page: from_config, .to("cuda"),
AdamW, a few steps, then an evaluation pass under torch.no_grad().
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, GPT2Config


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--n-positions", type=int, default=64)
    args = parser.parse_args()

    config = GPT2Config(
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        n_head=args.n_head,
        vocab_size=args.vocab_size,
        n_positions=args.n_positions,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = AutoModelForCausalLM.from_config(config)
    print(f"{torch.cuda.get_device_name(0)}: {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB free")
    torch.cuda.reset_peak_memory_stats()
    model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)

    for step in range(args.steps):
        input_ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len)).to("cuda")
        outputs = model(input_ids=input_ids, labels=input_ids)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.3f}")

    model.eval()
    with torch.no_grad():
        input_ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), device="cuda")
        eval_loss = model(input_ids=input_ids, labels=input_ids).loss
    print(f"eval loss {eval_loss.item():.3f}")
    print(f"peak memory: {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
