# ruff: noqa: E501, I001, B007, B009, SIM108  (the example's layout)
"""Re-creation of huggingface/peft examples/sequence_classification/RoAD.py (peft 0.18+, the
RoAD tuner's example), unchanged: `use_lora = True` (the LoRA baseline: r=8, alpha 16 on the
default BERT / RoBERTa targets) or, edited to False, `RoadConfig(variant="2", target_modules=
["query", "key", "value", "dense"])`; `roberta-large` on GLUE MRPC (local folders of those names
where the job runs), batch 32, 20 epochs, `AdamW(model.parameters())`, a linear schedule with 6%
warmup, `model.to("cuda")`, `batch.to(device)`, each epoch's evaluation.

As written it stops at `from_pretrained(..., return_dict=True, max_length=None)` on
transformers 5: `max_length` is no longer a config attribute, so it reaches the model's
`__init__` (TypeError, with or without peakmem). The file is kept as upstream has it.
"""

import evaluate
import torch
from datasets import load_dataset
from torch.optim import AdamW
from torch.utils.data import DataLoader
from tqdm import tqdm
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

from peft import (
    LoraConfig,
    PeftType,
    RoadConfig,
    get_peft_model,
)


use_lora = True

batch_size = 32
model_name_or_path = "roberta-large"
task = "mrpc"
if use_lora:
    peft_type = PeftType.LORA
else:
    peft_type = PeftType.ROAD
device = "cuda"
num_epochs = 20
max_length = 128
torch.manual_seed(0)

if use_lora:
    peft_config = LoraConfig(task_type="SEQ_CLS", inference_mode=False, r=8, lora_alpha=16, lora_dropout=0.1)
else:
    peft_config = RoadConfig(
        task_type="SEQ_CLS",
        variant="2",
        target_modules=["query", "key", "value", "dense"],
    )
if use_lora:
    lr = 3e-4
else:
    lr = 3e-3

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
    outputs = tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=max_length)
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

model = AutoModelForSequenceClassification.from_pretrained(model_name_or_path, return_dict=True, max_length=None)
model = get_peft_model(model, peft_config)
model.print_trainable_parameters()
# print(model)

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
