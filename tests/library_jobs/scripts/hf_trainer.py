"""transformers.Trainer on a tiny in-memory dataset (a torch Dataset of dicts; no download)."""

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import AutoModelForCausalLM, GPT2Config, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, n, seq_len, vocab_size):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab_size, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--samples", type=int, default=64)
    args = parser.parse_args()

    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    model = AutoModelForCausalLM.from_config(config)
    train = RandomTokens(args.samples, args.seq_len, config.vocab_size)

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            max_steps=args.max_steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=5e-4,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=train)
        result = trainer.train()
    print(result)


if __name__ == "__main__":
    main()
