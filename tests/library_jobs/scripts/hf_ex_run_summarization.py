# ruff: noqa: UP045  (kept as the original script writes it)
"""Re-creation of transformers' examples/pytorch/summarization/run_summarization.py
(Seq2SeqTrainer).

HfArgumentParser over ModelArguments / DataTrainingArguments / Seq2SeqTrainingArguments,
`datasets.load_dataset` on local JSON lines, `source_prefix`, tokenization with
`text_target=`, `DataCollatorForSeq2Seq` (labels padded with -100), `Seq2SeqTrainer` with
`predict_with_generate` (the evaluation generates up to `val_max_target_length` tokens),
`trainer.train()`, `trainer.evaluate(max_length=..., num_beams=...)`.

One change from the original: it scores with `evaluate.load("rouge")` and nltk's sentence
splitter; neither is installed here, so `compute_metrics` computes a unigram-overlap F1 with
plain Python on the decoded predictions (the same decoding of the generated ids).
"""

import logging
import sys
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from datasets import load_dataset

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(default=None)
    config_name: Optional[str] = field(default=None)
    tokenizer_name: Optional[str] = field(default=None)
    use_fast_tokenizer: bool = field(default=True)


@dataclass
class DataTrainingArguments:
    text_column: Optional[str] = field(default=None)
    summary_column: Optional[str] = field(default=None)
    train_file: Optional[str] = field(default=None)
    validation_file: Optional[str] = field(default=None)
    max_source_length: Optional[int] = field(default=1024)
    max_target_length: Optional[int] = field(default=128)
    val_max_target_length: Optional[int] = field(default=None)
    pad_to_max_length: bool = field(default=False)
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)
    num_beams: Optional[int] = field(default=1)
    ignore_pad_token_for_loss: bool = field(default=True)
    source_prefix: Optional[str] = field(default="")

    def __post_init__(self):
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    transformers.utils.logging.set_verbosity_info()
    logger.warning(f"device: {training_args.device}, n_gpu: {training_args.n_gpu}, "
                   f"16-bits training: {training_args.fp16}")
    set_seed(training_args.seed)

    data_files = {"train": data_args.train_file, "validation": data_args.validation_file}
    raw_datasets = load_dataset("json", data_files=data_files)

    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path,
                                              use_fast=model_args.use_fast_tokenizer)
    if model_args.model_name_or_path:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, config=config)
    else:
        model = AutoModelForSeq2SeqLM.from_config(config)
    embedding_size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embedding_size:
        model.resize_token_embeddings(len(tokenizer))
    if model.config.decoder_start_token_id is None:
        raise ValueError("Make sure that `config.decoder_start_token_id` is correctly defined")

    prefix = data_args.source_prefix if data_args.source_prefix is not None else ""
    column_names = raw_datasets["train"].column_names
    text_column = data_args.text_column or column_names[0]
    summary_column = data_args.summary_column or column_names[1]
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess_function(examples, max_target_length):
        inputs, targets = [], []
        for i in range(len(examples[text_column])):
            if examples[text_column][i] and examples[summary_column][i]:
                inputs.append(examples[text_column][i])
                targets.append(examples[summary_column][i])
        inputs = [prefix + inp for inp in inputs]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, padding=padding, truncation=True)
        labels = tokenizer(text_target=targets, max_length=max_target_length, padding=padding, truncation=True)
        if padding == "max_length" and data_args.ignore_pad_token_for_loss:
            labels["input_ids"] = [[(lab if lab != tokenizer.pad_token_id else -100) for lab in label]
                                   for label in labels["input_ids"]]
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    train_dataset = raw_datasets["train"]
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
    with training_args.main_process_first(desc="train dataset map pre-processing"):
        train_dataset = train_dataset.map(preprocess_function, batched=True, remove_columns=column_names,
                                          fn_kwargs={"max_target_length": data_args.max_target_length})
    eval_dataset = raw_datasets["validation"]
    if data_args.max_eval_samples is not None:
        eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))
    with training_args.main_process_first(desc="validation dataset map pre-processing"):
        eval_dataset = eval_dataset.map(preprocess_function, batched=True, remove_columns=column_names,
                                        fn_kwargs={"max_target_length": data_args.val_max_target_length})

    label_pad_token_id = -100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id
    data_collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=label_pad_token_id,
                                           pad_to_multiple_of=8 if training_args.fp16 else None)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded_preds = tokenizer.batch_decode(preds, skip_special_tokens=True)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_labels = tokenizer.batch_decode(labels, skip_special_tokens=True)
        scores = []
        for pred, label in zip(decoded_preds, decoded_labels, strict=True):
            p, r = set(pred.split()), set(label.split())
            overlap = len(p & r)
            scores.append(0.0 if not overlap else 2 * overlap / (len(p) + len(r)))
        prediction_lens = [np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds]
        return {"unigram_f1": round(float(np.mean(scores)) * 100, 4), "gen_len": float(np.mean(prediction_lens))}

    training_args.generation_max_length = (training_args.generation_max_length
                                           if training_args.generation_max_length is not None
                                           else data_args.val_max_target_length)
    training_args.generation_num_beams = (data_args.num_beams if data_args.num_beams is not None
                                          else training_args.generation_num_beams)

    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )

    if training_args.do_train:
        train_result = trainer.train()
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(max_length=training_args.generation_max_length,
                                   num_beams=training_args.generation_num_beams, metric_key_prefix="eval")
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
