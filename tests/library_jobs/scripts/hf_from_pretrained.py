"""Fine-tune a local checkpoint: from_pretrained(local_dir, torch_dtype=torch.bfloat16).

The checkpoint directory (config.json + model.safetensors) is written beforehand by
`save_pretrained`; the script trains the bf16 model with AdamW in a plain loop.
"""

import argparse

import torch
from transformers import AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    args = parser.parse_args()

    model = AutoModelForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.bfloat16)
    model = model.to("cuda")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    vocab = model.config.vocab_size
    for step in range(args.steps):
        batch = torch.randint(0, vocab, (args.batch_size, args.seq_len), device="cuda")
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(step, loss.item())


if __name__ == "__main__":
    main()
