# ruff: noqa: E501, I001, B007, B009, F401, SIM108  (the notebook's layout and imports)
"""Re-creation of huggingface/peft examples/sequence_classification/FourierFT.ipynb (peft
0.12-0.2x, "Using FourierFT for sequence classification"), its cells in order as one script:
`FourierFTConfig(n_frequency=1000, target_modules=["query", "value"], scaling=150.0)` on
`roberta-base` for GLUE MRPC: each targeted Linear trains `fourierft_spectrum` (n_frequency
coefficients at fixed random frequencies, the `indices` a buffer) and, every forward, builds its
delta weight as `torch.fft.ifft2` of a dense out x in spectrum (complex) times `scaling`; the
classifier trained as a copy (modules_to_save); `device =
torch.accelerator.current_accelerator().type`, `AdamW` over the classifier's parameters (its
frozen original and the trainable copy) and a `filter` over the rest by `id` (frozen ones have
no gradient, so no state), `weight_decay=0.`, a linear schedule with 6% warmup, `model.to(device)`
after the optimizer is built, `batch.to(device)`, tqdm loops, each epoch's evaluation. The Hub
cells are left out: they need the network.

One change: `from_pretrained(..., max_length=None)` loses its `max_length` (transformers 5 hands
it to the model's `__init__`: TypeError with or without peakmem). The notebook's constants are
kept (batch 32, 5 epochs); `roberta-base` and `glue` are read from local folders of those names.
"""

import torch
from torch.optim import AdamW
from torch.utils.data import DataLoader
from peft import (
    get_peft_model,
    FourierFTConfig,
    PeftType,
)

import evaluate
from datasets import load_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup, set_seed, AutoConfig
from tqdm import tqdm

# ## Parameters

batch_size = 32
model_name_or_path = "roberta-base"
task = "mrpc"
peft_type = PeftType.FOURIERFT
device = torch.accelerator.current_accelerator().type if hasattr(torch, "accelerator") else "cuda"
num_epochs = 5  # for better results, increase this number
n_frequency = 1000        # for better results, increase this number
scaling = 150.0
max_length = 512
torch.manual_seed(0)

peft_config = FourierFTConfig(
    task_type="SEQ_CLS",
    n_frequency=n_frequency,
    target_modules=["query", "value"],
    scaling = scaling,
)
head_lr = 6e-3  # the learning rate for the classification head for NLU tasks
fft_lr = 6e-2   # the learning rate for the parameters other than the classification head (q,v in this case)

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

# ## Preparing the FourierFT model

# the notebook passes `max_length=None` too: transformers 5 no longer takes it in a config and
# hands it to the model's __init__ (TypeError, with or without peakmem), so it is left out here
model = AutoModelForSequenceClassification.from_pretrained(model_name_or_path, return_dict=True)
model = get_peft_model(model, peft_config)
model.print_trainable_parameters()

head_param = list(map(id, model.classifier.parameters()))

others_param = filter(lambda p: id(p) not in head_param, model.parameters())

optimizer = AdamW([
    {"params": model.classifier.parameters(), "lr": head_lr},
    {"params": others_param, "lr": fft_lr}
],weight_decay=0.)


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
