# ruff: noqa: E501, I001, B007  (the example's layout)
"""Re-creation of huggingface/accelerate examples/by_feature/automatic_gradient_accumulation.py
(as of commit 09a53e80): nlp_example.py (BERT on GLUE MRPC; "bert-base-cased" and
`load_dataset("glue", "mrpc")` read from local directories of those names where the job runs)
with the whole model / optimizer / loader set-up inside a function decorated by
`find_executable_batch_size(starting_batch_size=observed_batch_size)`: each try sets
`accelerator.gradient_accumulation_steps = observed_batch_size // batch_size`, calls
`accelerator.free_memory()` and `set_seed`, builds the model and AdamW anew and trains under
`accelerator.accumulate(model)`, so that an out-of-memory error halves the batch and doubles the
accumulation (same effective batch). The metric is `evaluate.load("glue", "mrpc")`."""

import argparse
import os

import evaluate
import torch
from datasets import load_dataset
from torch.optim import AdamW
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup, set_seed

from accelerate import Accelerator
from accelerate.utils import find_executable_batch_size


EVAL_BATCH_SIZE = 32


def get_dataloaders(accelerator: Accelerator, batch_size: int = 16):
    """Train / validation DataLoaders of GLUE MRPC tokenized by bert-base-cased's tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")
    datasets = load_dataset("glue", "mrpc")

    def tokenize_function(examples):
        # max_length=None: the model's maximum length
        return tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)

    with accelerator.main_process_first():
        tokenized_datasets = datasets.map(
            tokenize_function,
            batched=True,
            remove_columns=["idx", "sentence1", "sentence2"],
        )
    tokenized_datasets = tokenized_datasets.rename_column("label", "labels")

    def collate_fn(examples):
        # round multiples of 8 (16 for fp8) under mixed precision
        if accelerator.mixed_precision == "fp8":
            pad_to_multiple_of = 16
        elif accelerator.mixed_precision != "no":
            pad_to_multiple_of = 8
        else:
            pad_to_multiple_of = None
        return tokenizer.pad(examples, padding="longest", pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt")

    train_dataloader = DataLoader(tokenized_datasets["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size)
    eval_dataloader = DataLoader(tokenized_datasets["validation"], shuffle=False, collate_fn=collate_fn, batch_size=EVAL_BATCH_SIZE)
    return train_dataloader, eval_dataloader


if os.environ.get("TESTING_MOCKED_DATALOADERS", None) == "1":
    from accelerate.test_utils.training import mocked_dataloaders

    get_dataloaders = mocked_dataloaders  # noqa: F811


def training_function(config, args):
    if os.environ.get("TESTING_MOCKED_DATALOADERS", None) == "1":
        config["num_epochs"] = 2
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    seed = int(config["seed"])
    observed_batch_size = int(config["batch_size"])

    metric = evaluate.load("glue", "mrpc")

    # New Code #
    # Each out-of-memory error retries this function with half the batch size; the accumulation
    # steps make up the difference to the observed batch size.
    @find_executable_batch_size(starting_batch_size=int(observed_batch_size))
    def inner_training_loop(batch_size):
        nonlocal accelerator  # the outer Accelerator is changed in place

        num_gradient_accumulation_steps = observed_batch_size // batch_size
        accelerator.gradient_accumulation_steps = num_gradient_accumulation_steps

        # drop the references the Accelerator holds from an earlier try
        accelerator.free_memory()
        set_seed(seed)

        model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased", return_dict=True)
        model = model.to(accelerator.device)
        optimizer = AdamW(params=model.parameters(), lr=lr)
        train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
        lr_scheduler = get_linear_schedule_with_warmup(
            optimizer=optimizer,
            num_warmup_steps=100,
            num_training_steps=(len(train_dataloader) * num_epochs),
        )

        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
            model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
        )

        for epoch in range(num_epochs):
            model.train()
            for step, batch in enumerate(train_dataloader):
                with accelerator.accumulate(model):
                    batch.to(accelerator.device)
                    outputs = model(**batch)
                    loss = outputs.loss
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()

            model.eval()
            for step, batch in enumerate(eval_dataloader):
                batch.to(accelerator.device)
                with torch.no_grad():
                    outputs = model(**batch)
                predictions = outputs.logits.argmax(dim=-1)
                predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
                metric.add_batch(predictions=predictions, references=references)

            eval_metric = metric.compute()
            accelerator.print(f"epoch {epoch}:", eval_metric)

    # New Code #
    # called with no argument: the decorator supplies the batch size
    inner_training_loop()
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"],
                        help="Whether to use mixed precision (bf16 needs an Ampere or newer GPU).")
    parser.add_argument("--observed_batch_size", type=int, default=256,
                        help="The effective batch size kept while `find_executable_batch_size` lowers the per-step batch.")
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 2e-5, "num_epochs": 3, "seed": 42, "batch_size": args.observed_batch_size}
    training_function(config, args)


if __name__ == "__main__":
    main()
