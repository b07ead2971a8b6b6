# ruff: noqa
"""sentence-transformers' `examples/cross_encoder/training/sts/training_stsbenchmark.py`
(UKPLab/sentence-transformers, Apache-2.0), re-created in its v4+ form (the CrossEncoder
trainer API, as in sentence-transformers 6.2): `CrossEncoder(model_name, num_labels=1)`, the
`sentence-transformers/stsb` pairs from `load_dataset` (train / validation / test splits, scores
in 0..1), `BinaryCrossEntropyLoss`, a `CrossEncoderCorrelationEvaluator` run before training,
every `eval_steps` and on the test split after, `CrossEncoderTrainingArguments` (warm-up ratio,
step-wise evaluation and checkpoints, `save_total_limit`), `CrossEncoderTrainer.train()`, then
`save_pretrained` of the final model.

As upstream, the model and data set are named, not passed: "distilroberta-base" and
"sentence-transformers/stsb" resolve to local folders of those names in the working directory
when they exist there (no network needed), and to the Hub otherwise.
"""

import logging
import traceback
from datetime import datetime

from datasets import load_dataset

from sentence_transformers.cross_encoder import CrossEncoder
from sentence_transformers.cross_encoder.evaluation import CrossEncoderCorrelationEvaluator
from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
from sentence_transformers.cross_encoder.trainer import CrossEncoderTrainer
from sentence_transformers.cross_encoder.training_args import CrossEncoderTrainingArguments

logging.basicConfig(format="%(asctime)s - %(message)s", datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO)

model_name = "distilroberta-base"
train_batch_size = 64
num_epochs = 4
output_dir = "output/training_ce_stsbenchmark-" + model_name.replace("/", "-") + "-" + datetime.now().strftime("%Y-%m-%d_%H-%M-%S")

# 1. one output: a similarity score read through a sigmoid, so that 0..1 targets fit it
model = CrossEncoder(model_name, num_labels=1)

# 2. the STS benchmark: (sentence1, sentence2, score) with scores already normalised to 0..1
train_dataset = load_dataset("sentence-transformers/stsb", split="train")
eval_dataset = load_dataset("sentence-transformers/stsb", split="validation")
test_dataset = load_dataset("sentence-transformers/stsb", split="test")
logging.info(train_dataset)

# 3. binary cross-entropy on the logit against the soft score
loss = BinaryCrossEntropyLoss(model)

# 4. Spearman / Pearson correlation of the predicted scores on the validation pairs
eval_evaluator = CrossEncoderCorrelationEvaluator(
    sentence_pairs=list(zip(eval_dataset["sentence1"], eval_dataset["sentence2"])),
    scores=eval_dataset["score"],
    name="stsb-validation",
)
eval_evaluator(model)

# 5. training arguments
short_model_name = model_name if "/" not in model_name else model_name.split("/")[-1]
run_name = f"reranker-{short_model_name}-stsb"
args = CrossEncoderTrainingArguments(
    output_dir=output_dir,
    num_train_epochs=num_epochs,
    per_device_train_batch_size=train_batch_size,
    per_device_eval_batch_size=train_batch_size,
    warmup_ratio=0.1,
    fp16=False,  # True where the GPU runs fp16
    bf16=False,  # True where the GPU runs bf16
    eval_strategy="steps",
    eval_steps=80,
    save_strategy="steps",
    save_steps=80,
    save_total_limit=2,
    logging_steps=20,
    run_name=run_name,
)

# 6. train
trainer = CrossEncoderTrainer(
    model=model,
    args=args,
    train_dataset=train_dataset,
    eval_dataset=eval_dataset,
    loss=loss,
    evaluator=eval_evaluator,
)
trainer.train()

# 7. the test split
test_evaluator = CrossEncoderCorrelationEvaluator(
    sentence_pairs=list(zip(test_dataset["sentence1"], test_dataset["sentence2"])),
    scores=test_dataset["score"],
    name="stsb-test",
)
test_evaluator(model)

# 8. the final model
final_output_dir = f"{output_dir}/final"
model.save_pretrained(final_output_dir)

# 9. (optional) to the Hub
try:
    model.push_to_hub(run_name)
except Exception:
    logging.error(f"Error uploading model to the Hugging Face Hub:\n{traceback.format_exc()}To upload it manually, "
                  f"run `huggingface-cli login`, then load the model from {final_output_dir!r} and push it.")
