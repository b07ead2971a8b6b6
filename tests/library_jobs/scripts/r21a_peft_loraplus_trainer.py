# ruff: noqa: I001  (peft examples import peft last)
"""peft's LoRA+ recipe (huggingface/peft docs/source/developer_guides/lora.md, "LoRA+ optimized
LoRA", peft 0.10-0.2x) in a transformers Trainer fine-tuning script: a causal LM wrapped by
`get_peft_model(LoraConfig(...))`, `create_loraplus_optimizer(model=model, optimizer_cls=...,
lr=5e-5, loraplus_lr_ratio=16)` (lora_A in one group at `lr`, lora_B and 1-d tensors at
`lr * ratio`, embeddings apart), `scheduler = None` and `Trainer(..., optimizers=(optimizer,
scheduler))`, so the Trainer builds its own schedule around the given optimizer and creates no
optimizer of its own. The docs pass `bnb.optim.Adam8bit`; `--optimizer_cls adamw` (the default
here) passes `torch.optim.AdamW`, as create_loraplus_optimizer's tests do. The data: a local
text file tokenized, grouped into blocks, `DataCollatorForLanguageModeling(mlm=False)`.

    python r21a_peft_loraplus_trainer.py --model_name_or_path gpt2 --train_file train.txt \
        --output_dir out --max_steps 100 --lora_r 16 --loraplus_lr_ratio 16
"""

import argparse

import torch
from datasets import load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

from peft import LoraConfig, get_peft_model
from peft.optimizers import create_loraplus_optimizer


def parse_args():
    parser = argparse.ArgumentParser(description="LoRA+ fine-tuning of a causal LM with the Trainer")
    parser.add_argument("--model_name_or_path", type=str, required=True)
    parser.add_argument("--train_file", type=str, required=True)
    parser.add_argument("--output_dir", type=str, required=True)
    parser.add_argument("--block_size", type=int, default=32)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--loraplus_lr_ratio", type=float, default=16)
    parser.add_argument("--lora_r", type=int, default=16)
    parser.add_argument("--lora_alpha", type=int, default=32)
    parser.add_argument("--optimizer_cls", choices=["adamw", "adam8bit"], default="adamw")
    return parser.parse_args()


def main():
    args = parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    raw = load_dataset("text", data_files={"train": args.train_file})

    def tokenize(examples):
        return tokenizer(examples["text"])

    def group_texts(examples):
        concatenated = {k: sum(examples[k], []) for k in examples}
        total = (len(concatenated["input_ids"]) // args.block_size) * args.block_size
        return {k: [t[i : i + args.block_size] for i in range(0, total, args.block_size)]
                for k, t in concatenated.items()}

    tokenized = raw.map(tokenize, batched=True, remove_columns=["text"])
    train_dataset = tokenized.map(group_texts, batched=True)["train"]

    base_model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.05, task_type="CAUSAL_LM")
    model = get_peft_model(base_model, config)
    model.print_trainable_parameters()

    if args.optimizer_cls == "adam8bit":
        import bitsandbytes as bnb

        optimizer_cls = bnb.optim.Adam8bit
    else:
        optimizer_cls = torch.optim.AdamW
    optimizer = create_loraplus_optimizer(
        model=model,
        optimizer_cls=optimizer_cls,
        lr=args.learning_rate,
        loraplus_lr_ratio=args.loraplus_lr_ratio,
    )
    scheduler = None
    print("LoRA+ groups:", [(len(g["params"]), g["lr"]) for g in optimizer.param_groups])

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.per_device_train_batch_size,
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        optimizers=(optimizer, scheduler),
    )
    trainer.train()
    model.save_pretrained(args.output_dir)


if __name__ == "__main__":
    main()
