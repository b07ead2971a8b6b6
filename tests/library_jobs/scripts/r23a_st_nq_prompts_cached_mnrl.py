# ruff: noqa
"""sentence-transformers' `examples/sentence_transformer/training/prompts/training_nq_prompts.py`
(UKPLab/sentence-transformers, Apache-2.0; as of commit 0d5d564c), re-created in its structure:
seeds for random / torch / numpy, "microsoft/mpnet-base" with model card data and
`set_pooling_include_prompt`, the "query: " / "document: " prompts per column, Natural Questions
pairs (`sentence-transformers/natural-questions`, split train) cut by `train_test_split(test_size=
1_000)`, `CachedMultipleNegativesRankingLoss(mini_batch_size=16)` (GradCache: the batch embedded
in no-grad mini-batches, the loss's backward re-running each mini-batch with its cached
gradient), bf16 training arguments with the NO_DUPLICATES batch sampler, step-wise evaluation and
checkpoints, `NanoBEIREvaluator` with the prompts before and after `trainer.train()`,
`save_pretrained`, and `push_to_hub` (not in a try, as upstream).

The model and data set names resolve to local folders of those names in the working directory
when they exist there (no network needed).
"""

import logging
import random

import numpy
import torch
from datasets import Dataset, load_dataset

from sentence_transformers import (
    SentenceTransformer,
    SentenceTransformerModelCardData,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
)
from sentence_transformers.evaluation import NanoBEIREvaluator
from sentence_transformers.losses import CachedMultipleNegativesRankingLoss
from sentence_transformers.training_args import BatchSamplers

logging.basicConfig(format="%(asctime)s - %(message)s", datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO)
random.seed(12)
torch.manual_seed(12)
numpy.random.seed(12)

# the two switches the example is about
use_prompts = True
include_prompts_in_pooling = True

# 1. the base model (mean pooling added to the plain checkpoint) and its model card data
model = SentenceTransformer(
    "microsoft/mpnet-base",
    model_card_data=SentenceTransformerModelCardData(
        language="en",
        license="apache-2.0",
        model_name="MPNet base trained on Natural Questions pairs",
    ),
)
model.set_pooling_include_prompt(include_prompts_in_pooling)

# 2. a prompt per column of the training pairs
if use_prompts:
    query_prompt = "query: "
    corpus_prompt = "document: "
    prompts = {
        "query": query_prompt,
        "answer": corpus_prompt,
    }

# 3. (query, answer) pairs, 1,000 of them held out
dataset = load_dataset("sentence-transformers/natural-questions", split="train")
dataset_dict = dataset.train_test_split(test_size=1_000, seed=12)
train_dataset: Dataset = dataset_dict["train"]
eval_dataset: Dataset = dataset_dict["test"]

# 4. in-batch negatives over the whole batch, embedded 16 texts at a time
loss = CachedMultipleNegativesRankingLoss(model, mini_batch_size=16)

# 5. training arguments
run_name = "mpnet-base-nq"
if use_prompts:
    run_name += "-prompts"
if not include_prompts_in_pooling:
    run_name += "-exclude-pooling-prompts"
args = SentenceTransformerTrainingArguments(
    output_dir=f"models/{run_name}",
    num_train_epochs=1,
    per_device_train_batch_size=256,
    per_device_eval_batch_size=256,
    learning_rate=2e-5,
    warmup_ratio=0.1,
    fp16=False,
    bf16=True,
    batch_sampler=BatchSamplers.NO_DUPLICATES,  # no duplicate texts among a batch's negatives
    eval_strategy="steps",
    eval_steps=50,
    save_strategy="steps",
    save_steps=50,
    save_total_limit=2,
    logging_steps=5,
    logging_first_step=True,
    run_name=run_name,
    seed=12,
    prompts=prompts if use_prompts else None,
)

# 6. the NanoBEIR retrieval evaluator, run once on the base model
dev_evaluator = NanoBEIREvaluator(
    query_prompts=query_prompt if use_prompts else None,
    corpus_prompts=corpus_prompt if use_prompts else None,
)
dev_evaluator(model)

# 7. train
trainer = SentenceTransformerTrainer(
    model=model,
    args=args,
    train_dataset=train_dataset,
    eval_dataset=eval_dataset,
    loss=loss,
    evaluator=dev_evaluator,
)
trainer.train()

# the evaluator again, on the trained model
dev_evaluator(model)

# 8. save
model.save_pretrained(f"models/{run_name}/final")

# 9. to the Hub
model.push_to_hub(run_name)
