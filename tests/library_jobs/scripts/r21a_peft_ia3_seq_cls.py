# ruff: noqa: E501, I001, B007, B009, F401, SIM108  (the notebook's layout and imports)
"""Re-creation of huggingface/peft examples/sequence_classification/IA3.ipynb (peft 0.4-0.2x),
its cells in order as one script: `peft.IA3Config(task_type="SEQ_CLS", inference_mode=False,
)` on `roberta-large` for GLUE MRPC, peft's default IA3 targets for the model
type (BERT / RoBERTa: `key`, `value`, `output.dense`, the last one a feed-forward layer whose
`ia3_l` scales its input), the classifier trained as a copy (modules_to_save); the notebook's
`importlib.reload(peft)` cell, the `key_list` print of `model.model.named_modules()`,
`AdamW(params=model.parameters())` (the frozen base has no gradient, so no state), a linear
schedule with 6% warmup, `device = "cuda"`, `model.to(device)` after the optimizer is built,
`batch.to(device)` on the BatchEncoding, tqdm loops, each epoch's evaluation. The Hub cells
(`push_to_hub`, loading an adapter from an account) are left out: they need the network.

One change: IA3Config's `ia3_dropout=0.0` is left out (see the cell).
The notebook's constants are kept (batch 8, 20 epochs); `roberta-large` and `glue` are read
from local folders of those names where the job runs.
"""

import argparse
import os

import torch
from torch.optim import AdamW
from torch.utils.data import DataLoader
import peft

import evaluate
from datasets import load_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup, set_seed
from tqdm import tqdm

import importlib
importlib.reload(peft)

batch_size = 8
model_name_or_path = "roberta-large"
task = "mrpc"
peft_type = peft.PeftType.IA3
device = "cuda"
num_epochs = 20

# peft_config = LoraConfig(task_type="SEQ_CLS", inference_mode=False, r=8, lora_alpha=16, lora_dropout=0.1)
# the notebook (peft 0.4) passes `ia3_dropout=0.0` too: IA3Config has had no dropout since peft 0.5
# (TypeError, with or without peakmem), so it is left out here
peft_config = peft.IA3Config(task_type="SEQ_CLS", inference_mode=False)
lr = 3e-4

if any(k in model_name_or_path for k in ("gpt", "opt", "bloom")):
    padding_side = "left"
else:
    padding_side = "right"

tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, padding_side=padding_side)
if getattr(tokenizer, "pad_token_id") is None:
    tokenizer.pad_token_id = tokenizer.eos_token_id

datasets = load_dataset("glue", task)
metric = evaluate.load("glue", task)


def tokenize_function(examples):
    # max_length=None => use the model max length (it's actually the default)
    outputs = tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)
    return outputs


tokenized_datasets = datasets.map(
    tokenize_function,
    batched=True,
    remove_columns=["idx", "sentence1", "sentence2"],
)

# We also rename the 'label' column to 'labels' which is the expected name for labels by the models of the
# transformers library
tokenized_datasets = tokenized_datasets.rename_column("label", "labels")


def collate_fn(examples):
    return tokenizer.pad(examples, padding="longest", return_tensors="pt")


# Instantiate dataloaders.
train_dataloader = DataLoader(tokenized_datasets["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size)
eval_dataloader = DataLoader(
    tokenized_datasets["validation"], shuffle=False, collate_fn=collate_fn, batch_size=batch_size
)

model = AutoModelForSequenceClassification.from_pretrained(model_name_or_path, return_dict=True)
model = peft.get_peft_model(model, peft_config)
model.print_trainable_parameters()
print(model)

key_list = [key for key, _ in model.model.named_modules()]
print("Key list: ", key_list)

optimizer = AdamW(params=model.parameters(), lr=lr)

# Instantiate scheduler
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer=optimizer,
    num_warmup_steps=0.06 * (len(train_dataloader) * num_epochs),
    num_training_steps=(len(train_dataloader) * num_epochs),
)

model.to(device)
for epoch in range(num_epochs):
    model.train()
    for step, batch in enumerate(tqdm(train_dataloader)):
        batch.to(device)
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()

    model.eval()
    for step, batch in enumerate(tqdm(eval_dataloader)):
        batch.to(device)
        with torch.no_grad():
            outputs = model(**batch)
        predictions = outputs.logits.argmax(dim=-1)
        predictions, references = predictions, batch["labels"]
        metric.add_batch(
            predictions=predictions,
            references=references,
        )

    eval_metric = metric.compute()
    print(f"epoch {epoch}:", eval_metric)
