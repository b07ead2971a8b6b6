# ruff: noqa: UP045  (kept as the original script writes it)
"""Re-creation of transformers' examples/pytorch/image-classification/run_image_classification.py
(Trainer).

HfArgumentParser over DataTrainingArguments / ModelArguments / TrainingArguments,
`datasets.load_dataset("imagefolder")` on `--train_dir` / `--validation_dir`, the label maps from
the data, `AutoImageProcessor`, torchvision transforms applied with `set_transform`, a
`collate_fn` stacking pixel_values, `Trainer` (the script's run needs
`--remove_unused_columns False`), `train()`, `save_model`, `evaluate()`.

One change from the original: it loads `evaluate.load("accuracy")`; evaluate is not installed
here, so `compute_metrics` counts the same accuracy with numpy.
"""

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import transformers
from torchvision.transforms import (
    CenterCrop,
    Compose,
    Lambda,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
)
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForImageClassification,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

from datasets import load_dataset

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    dataset_name: Optional[str] = field(default=None)
    train_dir: Optional[str] = field(default=None)
    validation_dir: Optional[str] = field(default=None)
    train_val_split: Optional[float] = field(default=0.15)
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)
    image_column_name: str = field(default="image")
    label_column_name: str = field(default="label")


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="google/vit-base-patch16-224-in21k")
    config_name: Optional[str] = field(default=None)
    image_processor_name: Optional[str] = field(default=None)
    ignore_mismatched_sizes: bool = field(default=False)


def collate_fn(examples):
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    labels = torch.tensor([example["label"] for example in examples])
    return {"pixel_values": pixel_values, "labels": labels}


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    transformers.utils.logging.set_verbosity_info()
    logger.warning(f"device: {training_args.device}, n_gpu: {training_args.n_gpu}, "
                   f"16-bits training: {training_args.fp16}")
    set_seed(training_args.seed)

    if data_args.dataset_name is not None:
        dataset = load_dataset(data_args.dataset_name)
    else:
        data_files = {}
        if data_args.train_dir is not None:
            data_files["train"] = os.path.join(data_args.train_dir, "**")
        if data_args.validation_dir is not None:
            data_files["validation"] = os.path.join(data_args.validation_dir, "**")
        dataset = load_dataset("imagefolder", data_files=data_files)

    data_args.train_val_split = None if "validation" in dataset else data_args.train_val_split
    if isinstance(data_args.train_val_split, float) and data_args.train_val_split > 0.0:
        split = dataset["train"].train_test_split(data_args.train_val_split)
        dataset["train"] = split["train"]
        dataset["validation"] = split["test"]

    labels = dataset["train"].features[data_args.label_column_name].names
    label2id, id2label = {}, {}
    for i, label in enumerate(labels):
        label2id[label] = str(i)
        id2label[str(i)] = label

    def compute_metrics(p):
        return {"accuracy": float(np.mean(np.argmax(p.predictions, axis=1) == p.label_ids))}

    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path,
                                        num_labels=len(labels), label2id=label2id, id2label=id2label,
                                        finetuning_task="image-classification")
    model = AutoModelForImageClassification.from_pretrained(
        model_args.model_name_or_path, config=config, ignore_mismatched_sizes=model_args.ignore_mismatched_sizes)
    image_processor = AutoImageProcessor.from_pretrained(
        model_args.image_processor_name or model_args.model_name_or_path)

    if "shortest_edge" in image_processor.size:
        size = image_processor.size["shortest_edge"]
    else:
        size = (image_processor.size["height"], image_processor.size["width"])
    normalize = (Normalize(mean=image_processor.image_mean, std=image_processor.image_std)
                 if hasattr(image_processor, "image_mean") and hasattr(image_processor, "image_std")
                 else Lambda(lambda x: x))
    _train_transforms = Compose([RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(), normalize])
    _val_transforms = Compose([Resize(size), CenterCrop(size), ToTensor(), normalize])

    def train_transforms(example_batch):
        example_batch["pixel_values"] = [_train_transforms(pil_img.convert("RGB"))
                                         for pil_img in example_batch[data_args.image_column_name]]
        return example_batch

    def val_transforms(example_batch):
        example_batch["pixel_values"] = [_val_transforms(pil_img.convert("RGB"))
                                         for pil_img in example_batch[data_args.image_column_name]]
        return example_batch

    if training_args.do_train:
        if data_args.max_train_samples is not None:
            dataset["train"] = dataset["train"].shuffle(seed=training_args.seed).select(
                range(data_args.max_train_samples))
        dataset["train"].set_transform(train_transforms)
    if training_args.do_eval:
        if data_args.max_eval_samples is not None:
            dataset["validation"] = dataset["validation"].shuffle(seed=training_args.seed).select(
                range(data_args.max_eval_samples))
        dataset["validation"].set_transform(val_transforms)

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=dataset["train"] if training_args.do_train else None,
        eval_dataset=dataset["validation"] if training_args.do_eval else None,
        compute_metrics=compute_metrics,
        processing_class=image_processor,
        data_collator=collate_fn,
    )

    if training_args.do_train:
        train_result = trainer.train()
        trainer.save_model()
        trainer.log_metrics("train", train_result.metrics)
        trainer.save_metrics("train", train_result.metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
