# ruff: noqa
"""peft's task guide "LoRA methods", `docs/source/task_guides/lora_based_methods.md`
(huggingface/peft, Apache-2.0), its code cells as one script: image classification of Food-101
with `google/vit-base-patch16-224-in21k` and a low-rank method picked by the guide's tabs (here
the first argument: `lora`, `loha` or `lokr`, each with the guide's config: r 16, alpha 16,
query / value targeted, the classifier in `modules_to_save`), torchvision transforms built from
the image processor's mean / std / size through `set_transform`, a `collate_fn` stacking
`pixel_values`, and the Trainer with the guide's TrainingArguments (batch 128, 4 accumulation
steps, fp16, eval and save each epoch, `load_best_model_at_end`, `label_names`).
Changed for transformers 5: `Trainer(tokenizer=...)` is `processing_class=` (the `tokenizer`
keyword is gone: a TypeError with or without peakmem), and the targets: transformers 5.24's ViT
names its attention projections `q_proj` / `k_proj` / `v_proj` / `o_proj`, so the guide's
`["query", "value"]` matches nothing (peft's NoMatchingPeftModuleError with or without
peakmem) and the same two projections are named `["q_proj", "v_proj"]`; the output directory is the guide's
`peft_model_id` under the working directory. Run from a folder holding "food101" (an image
folder with train / validation splits) and the checkpoint under its Hub name.
"""

import sys

import torch
from datasets import load_dataset
from peft import LoHaConfig, LoKrConfig, LoraConfig, get_peft_model
from torchvision.transforms import (
    CenterCrop,
    Compose,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
)
from transformers import AutoImageProcessor, AutoModelForImageClassification, Trainer, TrainingArguments

method = sys.argv[1] if len(sys.argv) > 1 else "lora"

# Dataset
ds = load_dataset("food101")

labels = ds["train"].features["label"].names
label2id, id2label = dict(), dict()
for i, label in enumerate(labels):
    label2id[label] = i
    id2label[i] = label

print(id2label[1])

image_processor = AutoImageProcessor.from_pretrained("google/vit-base-patch16-224-in21k")

normalize = Normalize(mean=image_processor.image_mean, std=image_processor.image_std)
train_transforms = Compose(
    [
        RandomResizedCrop(image_processor.size["height"]),
        RandomHorizontalFlip(),
        ToTensor(),
        normalize,
    ]
)

val_transforms = Compose(
    [
        Resize(image_processor.size["height"]),
        CenterCrop(image_processor.size["height"]),
        ToTensor(),
        normalize,
    ]
)


def preprocess_train(example_batch):
    example_batch["pixel_values"] = [train_transforms(image.convert("RGB")) for image in example_batch["image"]]
    return example_batch


def preprocess_val(example_batch):
    example_batch["pixel_values"] = [val_transforms(image.convert("RGB")) for image in example_batch["image"]]
    return example_batch


train_ds = ds["train"]
val_ds = ds["validation"]

train_ds.set_transform(preprocess_train)
val_ds.set_transform(preprocess_val)


def collate_fn(examples):
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    labels = torch.tensor([example["label"] for example in examples])
    return {"pixel_values": pixel_values, "labels": labels}


# Model
model = AutoModelForImageClassification.from_pretrained(
    "google/vit-base-patch16-224-in21k",
    label2id=label2id,
    id2label=id2label,
    ignore_mismatched_sizes=True,
)

# PEFT configuration and model (the guide's tabs)
if method == "lora":
    config = LoraConfig(
        r=16,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj"],
        lora_dropout=0.1,
        bias="none",
        modules_to_save=["classifier"],
    )
elif method == "loha":
    config = LoHaConfig(
        r=16,
        alpha=16,
        target_modules=["q_proj", "v_proj"],
        module_dropout=0.1,
        modules_to_save=["classifier"],
    )
elif method == "lokr":
    config = LoKrConfig(
        r=16,
        alpha=16,
        target_modules=["q_proj", "v_proj"],
        module_dropout=0.1,
        modules_to_save=["classifier"],
    )
else:
    raise ValueError(f"unknown method {method}")
model = get_peft_model(model, config)
model.print_trainable_parameters()

# Training
account = "stevhliu"
peft_model_id = f"{account}/google/vit-base-patch16-224-in21k-{method}"
batch_size = 128

args = TrainingArguments(
    peft_model_id,
    remove_unused_columns=False,
    eval_strategy="epoch",
    save_strategy="epoch",
    learning_rate=5e-3,
    per_device_train_batch_size=batch_size,
    gradient_accumulation_steps=4,
    per_device_eval_batch_size=batch_size,
    fp16=True,
    num_train_epochs=5,
    logging_steps=10,
    load_best_model_at_end=True,
    label_names=["labels"],
)

trainer = Trainer(
    model,
    args,
    train_dataset=train_ds,
    eval_dataset=val_ds,
    processing_class=image_processor,
    data_collator=collate_fn,
)
trainer.train()
