"""Text classification with a `Trainer` subclass that overrides `compute_loss`, as transformers'
docs write it (Trainer, "Customize": a weighted `CrossEntropyLoss` over three labels) and the
Hugging Face course fine-tunes (local CSV through `datasets`, `AutoTokenizer`, `DataCollatorWithPadding`,
`compute_metrics` with numpy, `TrainingArguments` from the command line through HfArgumentParser).
"""

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)

from datasets import load_dataset


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={"help": "a config (and tokenizer) directory"})
    train_file: str = field(metadata={"help": "CSV with text,label"})
    validation_file: str = field(metadata={"help": "CSV with text,label"})
    max_length: int = field(default=48)


class CustomTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        # forward pass
        outputs = model(**inputs)
        logits = outputs.get("logits")
        # compute custom loss for 3 labels with different weights
        loss_fct = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0], device=model.device))
        loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
        return (loss, outputs) if return_outputs else loss


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    predictions = np.argmax(logits, axis=-1)
    return {"accuracy": float((predictions == labels).mean())}


def main():
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    args, training_args = parser.parse_args_into_dataclasses()

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    config = AutoConfig.from_pretrained(args.model_name_or_path, num_labels=3)
    model = AutoModelForSequenceClassification.from_config(config)

    raw = load_dataset("csv", data_files={"train": args.train_file, "validation": args.validation_file})

    def tokenize_function(example):
        return tokenizer(example["text"], truncation=True, max_length=args.max_length)

    tokenized = raw.map(tokenize_function, batched=True, remove_columns=["text"])
    tokenized = tokenized.rename_column("label", "labels")
    data_collator = DataCollatorWithPadding(tokenizer=tokenizer)

    trainer = CustomTrainer(
        model,
        training_args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        data_collator=data_collator,
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
    )
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
