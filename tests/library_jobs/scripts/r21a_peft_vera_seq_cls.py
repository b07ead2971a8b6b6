# ruff: noqa: E501, I001, B007, B009, F401, SIM108  (the notebook's layout and imports)
"""Re-creation of huggingface/peft examples/sequence_classification/VeRA.ipynb (peft 0.1x-0.2x,
"Using VeRA for sequence classification"), its cells in order as one script: `VeraConfig(r=8,
d_initial=0.1, target_modules=["query", "value", "intermediate.dense"], save_projection=True)` on
`roberta-base` for GLUE MRPC; the shared random projections `vera_A` / `vera_B` are buffers
(frozen, saved with the adapter), the trainable tensors are each layer's `vera_lambda_b` /
`vera_lambda_d` scaling vectors and the classifier (modules_to_save); `AdamW` over two parameter
groups picked by name (`vera_lambda_` at `vera_lr`, `classifier` at `head_lr`), a linear schedule
with 6% warmup, `device = infer_device()`, `model.to(device)` after the optimizer is built,
`batch.to(device)` on the BatchEncoding, tqdm loops, each epoch's evaluation. The Hub cells
(`push_to_hub`, `PeftModel.from_pretrained` from an account) are left out: they need the network.

One change: `from_pretrained(..., max_length=None)` loses its `max_length` (see the cell).
The notebook's constants are kept (batch 128, 5 epochs); `roberta-base` and `glue` are read
from local folders of those names where the job runs.
"""

import torch
from torch.optim import AdamW
from torch.utils.data import DataLoader
from peft import (
    get_peft_model,
    VeraConfig,
    PeftType,
)
from peft.utils import infer_device


import evaluate
from datasets import load_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup, set_seed, AutoConfig
from tqdm import tqdm

# ## Parameters

batch_size = 128
model_name_or_path = "roberta-base"
task = "mrpc"
peft_type = PeftType.VERA
device = infer_device()
num_epochs = 5  # for best results, increase this number
rank = 8        # for best results, increase this number
max_length = 128
torch.manual_seed(0)

peft_config = VeraConfig(
    task_type="SEQ_CLS",
    r=rank,
    d_initial=0.1,
    target_modules=["query", "value", "intermediate.dense"],
    save_projection=True,
)
head_lr = 1e-2
vera_lr = 2e-2

# ## Loading data

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

# ## Preparing the VeRA model

# the notebook passes `max_length=None` too: transformers 5 no longer takes it in a config and
# hands it to the model's __init__ (TypeError, with or without peakmem), so it is left out here
model = AutoModelForSequenceClassification.from_pretrained(model_name_or_path, return_dict=True)
model = get_peft_model(model, peft_config)
model.print_trainable_parameters()

optimizer = AdamW(
    [
        {"params": [p for n, p in model.named_parameters() if "vera_lambda_" in n], "lr": vera_lr},
        {"params": [p for n, p in model.named_parameters() if "classifier" in n], "lr": head_lr},
    ]
)

# Instantiate scheduler
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer=optimizer,
    num_warmup_steps=0.06 * (len(train_dataloader) * num_epochs),
    num_training_steps=(len(train_dataloader) * num_epochs),
)

# ## Training

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
