# ruff: noqa: UP045, B905  (kept as the original script writes it)
"""transformers' `examples/pytorch/question-answering/run_seq2seq_qa.py` (transformers 4.5x /
main), re-created in its structure with its `trainer_seq2seq_qa.py` beside it: written here,
not copied.

HfArgumentParser over ModelArguments / DataTrainingArguments / Seq2SeqTrainingArguments;
SQuAD-layout JSON (`id`, `question`, `context`, `answers: {text, answer_start}`) through
`load_dataset("json", field=...)`-less local files; inputs written as "question: Q context: C",
the first answer as the target (`text_target=`); the validation features tokenized with
`return_overflowing_tokens` / `return_offsets_mapping`, each feature keeping its `example_id`
and its example's label; `DataCollatorForSeq2Seq`; `QuestionAnsweringSeq2SeqTrainer` with
`predict_with_generate`, whose `post_processing_function` decodes the generated ids and maps
each example to its feature's answer; `evaluate(max_length=..., num_beams=...)`, `predict`.

One change from the original: it scores with `evaluate.load("squad")` (a Hub script; no network
here), so `compute_metrics` computes SQuAD's exact match and token F1 with plain Python on the
same post-processed predictions.
"""

import collections
import logging
import sys
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import transformers
from trainer_seq2seq_qa import QuestionAnsweringSeq2SeqTrainer
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    set_seed,
)
from transformers.trainer_utils import EvalLoopOutput, EvalPrediction

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
    context_column: Optional[str] = field(default="context")
    question_column: Optional[str] = field(default="question")
    answer_column: Optional[str] = field(default="answers")
    train_file: Optional[str] = field(default=None)
    validation_file: Optional[str] = field(default=None)
    test_file: Optional[str] = field(default=None)
    max_seq_length: int = field(default=384)
    max_answer_length: int = field(default=30)
    val_max_answer_length: Optional[int] = field(default=None)
    pad_to_max_length: bool = field(default=True)
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)
    max_predict_samples: Optional[int] = field(default=None)
    version_2_with_negative: bool = field(default=False)
    doc_stride: int = field(default=128)
    num_beams: Optional[int] = field(default=None)
    ignore_pad_token_for_loss: bool = field(default=True)

    def __post_init__(self):
        if self.val_max_answer_length is None:
            self.val_max_answer_length = self.max_answer_length


def _normalize(text):
    return " ".join(text.lower().split())


def squad_scores(predictions, references):
    """SQuAD's exact match and token F1 (the `squad` metric's rules, without the article and
    punctuation stripping)."""
    answers = {ref["id"]: ref["answers"]["text"] for ref in references}
    exact, f1 = [], []
    for pred in predictions:
        golds = [_normalize(a) for a in answers[pred["id"]]] or [""]
        text = _normalize(pred["prediction_text"])
        exact.append(max(float(text == gold) for gold in golds))
        best = 0.0
        for gold in golds:
            common = collections.Counter(text.split()) & collections.Counter(gold.split())
            same = sum(common.values())
            if same:
                precision, recall = same / len(text.split()), same / len(gold.split())
                best = max(best, 2 * precision * recall / (precision + recall))
        f1.append(best)
    return {"exact_match": 100 * float(np.mean(exact)), "f1": 100 * float(np.mean(f1))}


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    transformers.utils.logging.set_verbosity_info()
    logger.warning(f"device: {training_args.device}, n_gpu: {training_args.n_gpu}, "
                   f"16-bits training: {training_args.fp16}")
    set_seed(training_args.seed)

    data_files = {}
    if data_args.train_file is not None:
        data_files["train"] = data_args.train_file
    if data_args.validation_file is not None:
        data_files["validation"] = data_args.validation_file
    if data_args.test_file is not None:
        data_files["test"] = data_args.test_file
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

    if training_args.do_train:
        column_names = raw_datasets["train"].column_names
    elif training_args.do_eval:
        column_names = raw_datasets["validation"].column_names
    elif training_args.do_predict:
        column_names = raw_datasets["test"].column_names
    else:
        logger.info("There is nothing to do. Please pass `do_train`, `do_eval` and/or `do_predict`.")
        return

    question_column = data_args.question_column
    context_column = data_args.context_column
    answer_column = data_args.answer_column
    max_answer_length = data_args.max_answer_length
    padding = "max_length" if data_args.pad_to_max_length else False
    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)

    def preprocess_squad_batch(examples, question_column, context_column, answer_column):
        questions = examples[question_column]
        contexts = examples[context_column]
        answers = examples[answer_column]

        def generate_input(_question, _context):
            return " ".join(["question:", _question.lstrip(), "context:", _context.lstrip()])

        inputs = [generate_input(question, context) for question, context in zip(questions, contexts)]
        targets = [answer["text"][0] if len(answer["text"]) > 0 else "" for answer in answers]
        return inputs, targets

    def preprocess_function(examples):
        inputs, targets = preprocess_squad_batch(examples, question_column, context_column, answer_column)
        model_inputs = tokenizer(inputs, max_length=max_seq_length, padding=padding, truncation=True)
        labels = tokenizer(text_target=targets, max_length=max_answer_length, padding=padding, truncation=True)
        if padding == "max_length" and data_args.ignore_pad_token_for_loss:
            labels["input_ids"] = [
                [(token if token != tokenizer.pad_token_id else -100) for token in label] for label in labels["input_ids"]
            ]
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    def preprocess_validation_function(examples):
        inputs, targets = preprocess_squad_batch(examples, question_column, context_column, answer_column)
        model_inputs = tokenizer(
            inputs,
            max_length=max_seq_length,
            padding=padding,
            truncation=True,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )
        labels = tokenizer(text_target=targets, max_length=max_answer_length, padding=padding, truncation=True)
        if padding == "max_length" and data_args.ignore_pad_token_for_loss:
            labels["input_ids"] = [
                [(token if token != tokenizer.pad_token_id else -100) for token in label] for label in labels["input_ids"]
            ]
        # a long context gives several features: each keeps its example's id and label
        sample_mapping = model_inputs.pop("overflow_to_sample_mapping")
        model_inputs["example_id"] = []
        labels_out = []
        for i in range(len(model_inputs["input_ids"])):
            sample_index = sample_mapping[i]
            model_inputs["example_id"].append(examples["id"][sample_index])
            labels_out.append(labels["input_ids"][sample_index])
        model_inputs["labels"] = labels_out
        return model_inputs

    if training_args.do_train:
        train_dataset = raw_datasets["train"]
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
        with training_args.main_process_first(desc="train dataset map pre-processing"):
            train_dataset = train_dataset.map(preprocess_function, batched=True, remove_columns=column_names,
                                              desc="Running tokenizer on train dataset")

    if training_args.do_eval:
        eval_examples = raw_datasets["validation"]
        if data_args.max_eval_samples is not None:
            eval_examples = eval_examples.select(range(min(len(eval_examples), data_args.max_eval_samples)))
        with training_args.main_process_first(desc="validation dataset map pre-processing"):
            eval_dataset = eval_examples.map(preprocess_validation_function, batched=True,
                                             remove_columns=column_names,
                                             desc="Running tokenizer on validation dataset")

    if training_args.do_predict:
        predict_examples = raw_datasets["test"]
        if data_args.max_predict_samples is not None:
            predict_examples = predict_examples.select(range(data_args.max_predict_samples))
        with training_args.main_process_first(desc="prediction dataset map pre-processing"):
            predict_dataset = predict_examples.map(preprocess_validation_function, batched=True,
                                                   remove_columns=column_names,
                                                   desc="Running tokenizer on prediction dataset")

    label_pad_token_id = -100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id
    data_collator = DataCollatorForSeq2Seq(
        tokenizer,
        model=model,
        label_pad_token_id=label_pad_token_id,
        pad_to_multiple_of=8 if training_args.fp16 else None,
    )

    def compute_metrics(p: EvalPrediction):
        return squad_scores(predictions=p.predictions, references=p.label_ids)

    def post_processing_function(examples, features, outputs: EvalLoopOutput, stage="eval"):
        preds = outputs.predictions
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded_preds = tokenizer.batch_decode(preds, skip_special_tokens=True)

        # each example's answer is its (last) feature's generation
        example_id_to_index = {k: i for i, k in enumerate(examples["id"])}
        feature_per_example = {example_id_to_index[feature["example_id"]]: i for i, feature in enumerate(features)}
        predictions = {}
        for example_index, example in enumerate(examples):
            feature_index = feature_per_example[example_index]
            predictions[example["id"]] = decoded_preds[feature_index]

        if data_args.version_2_with_negative:
            formatted_predictions = [
                {"id": k, "prediction_text": v, "no_answer_probability": 0.0} for k, v in predictions.items()
            ]
        else:
            formatted_predictions = [{"id": k, "prediction_text": v} for k, v in predictions.items()]
        references = [{"id": ex["id"], "answers": ex[answer_column]} for ex in examples]
        return EvalPrediction(predictions=formatted_predictions, label_ids=references)

    trainer = QuestionAnsweringSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        eval_examples=eval_examples if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
        post_process_function=post_processing_function,
    )

    if training_args.do_train:
        train_result = trainer.train()
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    max_length = (
        training_args.generation_max_length
        if training_args.generation_max_length is not None
        else data_args.val_max_answer_length
    )
    num_beams = data_args.num_beams if data_args.num_beams is not None else training_args.generation_num_beams
    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(max_length=max_length, num_beams=num_beams, metric_key_prefix="eval")
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        results = trainer.predict(predict_dataset, predict_examples)
        metrics = results.metrics
        metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)


if __name__ == "__main__":
    main()
