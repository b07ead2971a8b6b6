"""Text from local files through HF `datasets` as run_clm_no_trainer.py does it
(`load_dataset("text" | "csv" | "json", data_files=...)`, `.map(tokenize, batched=True,
num_proc=N)`, then `group_texts` into blocks), tokenised with tiktoken as nanoGPT's prepare.py
does (`enc.encode_ordinary` + EOT), then `set_format("torch")` or
`with_format("torch", device="cuda")` feeding a DataLoader; a tiny next-token MLP trains on it.

tiktoken's BPE files come from the network; offline, `--encoding bytes` builds a byte-level
tiktoken `Encoding` (256 ranks, EOT 256) the same way tiktoken builds its own."""

import argparse
from itertools import chain

import tiktoken
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from datasets import load_dataset


def encoding(name: str) -> tiktoken.Encoding:
    if name != "bytes":
        return tiktoken.get_encoding(name)
    return tiktoken.Encoding(name="bytes", pat_str=r"""\S+|\s+""",
                             mergeable_ranks={bytes([i]): i for i in range(256)},
                             special_tokens={"<|endoftext|>": 256})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-file", required=True)
    parser.add_argument("--format", choices=["text", "csv", "json"], default="text")
    parser.add_argument("--encoding", default="bytes")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device-format", action="store_true")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--num-proc", type=int, default=1)
    args = parser.parse_args()

    enc = encoding(args.encoding)
    raw = load_dataset(args.format, data_files={"train": args.data_file})["train"]

    def tokenize(examples):
        return {"input_ids": [enc.encode_ordinary(t) + [enc.eot_token] for t in examples["text"]]}

    def group_texts(examples):
        ids = list(chain(*examples["input_ids"]))
        total = (len(ids) // (args.block_size + 1)) * (args.block_size + 1)
        return {"input_ids": [ids[i: i + args.block_size + 1]
                              for i in range(0, total, args.block_size + 1)]}

    tokenized = raw.map(tokenize, batched=True, num_proc=args.num_proc, remove_columns=raw.column_names,
                        desc="Running tokenizer on dataset")
    blocks = tokenized.map(group_texts, batched=True, desc="Grouping texts")
    device = torch.device("cuda")
    if args.device_format:
        blocks = blocks.with_format("torch", device="cuda")
    else:
        blocks.set_format("torch")
    print(f"{len(blocks)} blocks of {args.block_size + 1} tokens")
    loader = DataLoader(blocks, batch_size=args.batch_size, shuffle=True, drop_last=True)

    vocab = enc.n_vocab
    model = nn.Sequential(nn.Embedding(vocab, 64), nn.Linear(64, 128), nn.GELU(),
                          nn.Linear(128, vocab)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, batch in enumerate(loader):
        ids = batch["input_ids"].to(device, non_blocking=True)
        x, y = ids[:, :-1], ids[:, 1:]
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.view(-1, vocab), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.3f}")
        if step + 1 >= args.max_steps:
            break


if __name__ == "__main__":
    main()
