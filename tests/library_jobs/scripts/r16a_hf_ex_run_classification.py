# ruff: noqa: UP045, E741  (kept as the original script writes it)
"""Re-creation of transformers' examples/pytorch/text-classification/run_classification.py
(Trainer), from upstream commit 005c23ae (check_min_version("4.57.0.dev0"), the version whose
examples match the installed transformers 5's TrainingArguments: `processing_class=`).

HfArgumentParser over ModelArguments / DataTrainingArguments / TrainingArguments, local CSV or
JSON files through `load_dataset`, `--text_column_names a,b` joined into "sentence",
`--label_column_name` renamed to "label"; the task is inferred from the label column: float
-> regression (one output), list -> multi-label (`problem_type="multi_label_classification"`,
multi-hot float targets, BCEWithLogits), otherwise single-label. Labels gathered from every
split and sorted, `label2id` / `id2label` put on the config, padding to `max_seq_length` by
default (`default_data_collator`), `Trainer(processing_class=tokenizer)`, `train()`,
`save_model`, `save_state`, `evaluate()`, `predict()` written to predict_results.txt.

One change from the original: it loads `evaluate.load("accuracy" / "f1" multilabel / "mse")`;
evaluate's metric scripts come from the Hub (no network here), so `compute_metrics` counts
the same figures with numpy.
"""

import logging
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

import datasets
from datasets import Value, load_dataset

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    dataset_name: Optional[str] = field(default=None)
    dataset_config_name: Optional[str] = field(default=None)
    do_regression: bool = field(default=None)
    text_column_names: Optional[str] = field(default=None)
    text_column_delimiter: Optional[str] = field(default=" ")
    label_column_name: Optional[str] = field(default=None)
    max_seq_length: int = field(default=128)
    preprocessing_num_workers: Optional[int] = field(default=None)
    overwrite_cache: bool = field(default=False)
    pad_to_max_length: bool = field(default=True)
    shuffle_train_dataset: bool = field(default=False)
    shuffle_seed: int = field(default=42)
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)
    max_predict_samples: Optional[int] = field(default=None)
    train_file: Optional[str] = field(default=None)
    validation_file: Optional[str] = field(default=None)
    test_file: Optional[str] = field(default=None)

    def __post_init__(self):
        if self.dataset_name is None:
            if self.train_file is None or self.validation_file is None:
                raise ValueError(" training/validation file or a dataset name.")
            train_extension = self.train_file.split(".")[-1]
            assert train_extension in ["csv", "json"], "`train_file` should be a csv or a json file."
            assert self.validation_file.split(".")[-1] == train_extension


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Path to pretrained model"})
    config_name: Optional[str] = field(default=None)
    tokenizer_name: Optional[str] = field(default=None)
    cache_dir: Optional[str] = field(default=None)
    use_fast_tokenizer: bool = field(default=True)
    ignore_mismatched_sizes: bool = field(default=False)


def get_label_list(raw_dataset, split="train") -> list:
    if isinstance(raw_dataset[split]["label"][0], list):
        label_list = list({label for sample in raw_dataset[split]["label"] for label in sample})
    else:
        label_list = raw_dataset[split].unique("label")
    return [str(label) for label in label_list]


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    logger.warning(
        f"Process rank: {training_args.local_process_index}, device: {training_args.device}, "
        f"n_gpu: {training_args.n_gpu}, distributed training: "
        f"{training_args.parallel_mode.value == 'distributed'}, 16-bits training: {training_args.fp16}")
    set_seed(training_args.seed)

    if data_args.dataset_name is not None:
        raw_datasets = load_dataset(data_args.dataset_name, data_args.dataset_config_name,
                                    cache_dir=model_args.cache_dir)
    else:
        data_files = {"train": data_args.train_file, "validation": data_args.validation_file}
        if training_args.do_predict:
            if data_args.test_file is None:
                raise ValueError("Need either a dataset name or a test file for `do_predict`.")
            data_files["test"] = data_args.test_file
        builder = "csv" if data_args.train_file.endswith(".csv") else "json"
        raw_datasets = load_dataset(builder, data_files=data_files, cache_dir=model_args.cache_dir)

    if data_args.label_column_name is not None and data_args.label_column_name != "label":
        for key in raw_datasets:
            raw_datasets[key] = raw_datasets[key].rename_column(data_args.label_column_name, "label")

    is_regression = (
        raw_datasets["train"].features["label"].dtype in ["float32", "float64"]
        if data_args.do_regression is None
        else data_args.do_regression
    )
    is_multi_label = False
    if is_regression:
        label_list = None
        num_labels = 1
        for split in raw_datasets:
            if raw_datasets[split].features["label"].dtype not in ["float32", "float64"]:
                features = raw_datasets[split].features
                features.update({"label": Value("float32")})
                raw_datasets[split] = raw_datasets[split].cast(features)
    else:
        if raw_datasets["train"].features["label"].dtype == "list":
            is_multi_label = True
            logger.info("Label type is list, doing multi-label classification")
        label_list = get_label_list(raw_datasets, split="train")
        for split in ["validation", "test"]:
            if split in raw_datasets:
                diff = set(get_label_list(raw_datasets, split=split)).difference(set(label_list))
                if len(diff) > 0:
                    logger.warning(f"Labels {diff} in {split} set but not in training set, adding them")
                    label_list += list(diff)
        for label in label_list:
            if label == -1:
                label_list.remove(label)
        label_list.sort()
        num_labels = len(label_list)
        if num_labels <= 1:
            raise ValueError("You need more than one label to do classification.")

    config = AutoConfig.from_pretrained(
        model_args.config_name if model_args.config_name else model_args.model_name_or_path,
        num_labels=num_labels, finetuning_task="text-classification", cache_dir=model_args.cache_dir)
    if is_regression:
        config.problem_type = "regression"
    elif is_multi_label:
        config.problem_type = "multi_label_classification"
    else:
        config.problem_type = "single_label_classification"

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name if model_args.tokenizer_name else model_args.model_name_or_path,
        cache_dir=model_args.cache_dir, use_fast=model_args.use_fast_tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_args.model_name_or_path, from_tf=bool(".ckpt" in model_args.model_name_or_path),
        config=config, cache_dir=model_args.cache_dir,
        ignore_mismatched_sizes=model_args.ignore_mismatched_sizes)

    padding = "max_length" if data_args.pad_to_max_length else False

    if training_args.do_train and not is_regression:
        label_to_id = {v: i for i, v in enumerate(label_list)}
        if model.config.label2id != label_to_id:
            logger.warning("The label2id key in the model config.json is not equal to the label2id key of this run.")
        model.config.label2id = label_to_id
        model.config.id2label = {id: label for label, id in label_to_id.items()}
    elif not is_regression:
        label_to_id = model.config.label2id
    else:
        label_to_id = None

    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)

    def multi_labels_to_ids(labels: list) -> list:
        ids = [0.0] * len(label_to_id)  # BCELoss requires float as target type
        for label in labels:
            ids[label_to_id[label]] = 1.0
        return ids

    def preprocess_function(examples):
        if data_args.text_column_names is not None:
            text_column_names = data_args.text_column_names.split(",")
            examples["sentence"] = examples[text_column_names[0]]
            for column in text_column_names[1:]:
                for i in range(len(examples[column])):
                    examples["sentence"][i] += data_args.text_column_delimiter + examples[column][i]
        result = tokenizer(examples["sentence"], padding=padding, max_length=max_seq_length, truncation=True)
        if label_to_id is not None and "label" in examples:
            if is_multi_label:
                result["label"] = [multi_labels_to_ids(l) for l in examples["label"]]
            else:
                result["label"] = [(label_to_id[str(l)] if l != -1 else -1) for l in examples["label"]]
        return result

    with training_args.main_process_first(desc="dataset map pre-processing"):
        raw_datasets = raw_datasets.map(preprocess_function, batched=True,
                                        num_proc=data_args.preprocessing_num_workers,
                                        load_from_cache_file=not data_args.overwrite_cache,
                                        desc="Running tokenizer on dataset")

    if training_args.do_train:
        train_dataset = raw_datasets["train"]
        if data_args.shuffle_train_dataset:
            train_dataset = train_dataset.shuffle(seed=data_args.shuffle_seed)
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
    if training_args.do_eval:
        eval_dataset = raw_datasets["validation"]
        if data_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))
    if training_args.do_predict or data_args.test_file is not None:
        predict_dataset = raw_datasets["test"]
        if data_args.max_predict_samples is not None:
            predict_dataset = predict_dataset.select(range(min(len(predict_dataset), data_args.max_predict_samples)))

    if training_args.do_train:
        for index in random.sample(range(len(train_dataset)), 3):
            logger.info(f"Sample {index} of the training set: {train_dataset[index]}.")

    def compute_metrics(p: EvalPrediction):
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        if is_regression:
            preds = np.squeeze(preds)
            result = {"mse": float(np.mean((preds - p.label_ids) ** 2))}
        elif is_multi_label:
            preds = np.array([np.where(p > 0, 1, 0) for p in preds])
            tp = float(np.sum((preds == 1) & (p.label_ids == 1)))
            result = {"f1": 2 * tp / max(float(np.sum(preds) + np.sum(p.label_ids)), 1.0)}  # micro F1
        else:
            preds = np.argmax(preds, axis=1)
            result = {"accuracy": float(np.mean(preds == p.label_ids))}
        if len(result) > 1:
            result["combined_score"] = np.mean(list(result.values())).item()
        return result

    if data_args.pad_to_max_length:
        data_collator = default_data_collator
    elif training_args.fp16:
        data_collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    else:
        data_collator = None

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        compute_metrics=compute_metrics,
        processing_class=tokenizer,
        data_collator=data_collator,
    )

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.save_model()
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(eval_dataset=eval_dataset)
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        if "label" in predict_dataset.features:
            predict_dataset = predict_dataset.remove_columns("label")
        predictions = trainer.predict(predict_dataset, metric_key_prefix="predict").predictions
        if is_regression:
            predictions = np.squeeze(predictions)
        elif is_multi_label:
            predictions = np.array([np.where(p > 0, 1, 0) for p in predictions])
        else:
            predictions = np.argmax(predictions, axis=1)
        output_predict_file = os.path.join(training_args.output_dir, "predict_results.txt")
        if trainer.is_world_process_zero():
            with open(output_predict_file, "w") as writer:
                writer.write("index\tprediction\n")
                for index, item in enumerate(predictions):
                    if is_regression:
                        writer.write(f"{index}\t{item:3.3f}\n")
                    elif is_multi_label:
                        item = [label_list[i] for i in range(len(item)) if item[i] == 1]
                        writer.write(f"{index}\t{item}\n")
                    else:
                        writer.write(f"{index}\t{label_list[item]}\n")
        logger.info(f"Predict results saved at {output_predict_file}")


if __name__ == "__main__":
    main()
