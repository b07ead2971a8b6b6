# ruff: noqa
"""sentence-transformers' `examples/sentence_transformer/training/matryoshka/matryoshka_nli.py`
(UKPLab/sentence-transformers, Apache-2.0; as of commit e42edd30), re-created in its structure:
the model name from `sys.argv[1]` (default distilroberta-base: a Transformer module and mean
pooling), AllNLI triplets (`sentence-transformers/all-nli`, configuration `triplet`, splits
train / dev), `MatryoshkaLoss` over `MultipleNegativesRankingLoss` at dims [768, 512, 256, 128,
64], a `SequentialEvaluator` of STS-B `EmbeddingSimilarityEvaluator`s with `truncate_dim` per dim,
fp16 training arguments with the NO_DUPLICATES batch sampler and step-wise evaluation and
checkpoints, `SentenceTransformerTrainer.train()`, the test-split evaluators, `model.save`, and
`push_to_hub` in a try.

The data set names resolve to local folders of those names in the working directory when they
exist there (no network needed).
"""

import logging
import sys
import traceback
from datetime import datetime

from datasets import load_dataset

from sentence_transformers import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    losses,
)
from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator, SequentialEvaluator, SimilarityFunction
from sentence_transformers.training_args import BatchSamplers

logging.basicConfig(format="%(asctime)s - %(message)s", datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO)

model_name = sys.argv[1] if len(sys.argv) > 1 else "distilroberta-base"
batch_size = 128  # larger batches: more in-batch negatives, more GPU memory
num_train_epochs = 1
matryoshka_dims = [768, 512, 256, 128, 64]

output_dir = f"output/matryoshka_nli_{model_name.replace('/', '-')}-{datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}"

# 1. a Sentence Transformer (mean pooling added to a plain transformers checkpoint)
model = SentenceTransformer(model_name)
logging.info(model)

# 2. AllNLI (anchor, positive, negative) triplets
train_dataset = load_dataset("sentence-transformers/all-nli", "triplet", split="train")
eval_dataset = load_dataset("sentence-transformers/all-nli", "triplet", split="dev")
logging.info(train_dataset)

# 3. the ranking loss applied to each truncation of the embeddings
inner_train_loss = losses.MultipleNegativesRankingLoss(model)
train_loss = losses.MatryoshkaLoss(model, inner_train_loss, matryoshka_dims=matryoshka_dims)

# 4. STS-B correlation at every dimension during training
stsb_eval_dataset = load_dataset("sentence-transformers/stsb", split="validation")
evaluators = []
for dim in matryoshka_dims:
    evaluators.append(
        EmbeddingSimilarityEvaluator(
            sentences1=stsb_eval_dataset["sentence1"],
            sentences2=stsb_eval_dataset["sentence2"],
            scores=stsb_eval_dataset["score"],
            main_similarity=SimilarityFunction.COSINE,
            name=f"sts-dev-{dim}",
            truncate_dim=dim,
        )
    )
dev_evaluator = SequentialEvaluator(evaluators, main_score_function=lambda scores: scores[0])

# 5. training arguments
args = SentenceTransformerTrainingArguments(
    output_dir=output_dir,
    num_train_epochs=num_train_epochs,
    per_device_train_batch_size=batch_size,
    per_device_eval_batch_size=batch_size,
    warmup_ratio=0.1,
    fp16=True,  # False where the GPU cannot run fp16
    bf16=False,  # True where the GPU runs bf16
    batch_sampler=BatchSamplers.NO_DUPLICATES,  # no duplicate texts in a batch of in-batch negatives
    eval_strategy="steps",
    eval_steps=100,
    save_strategy="steps",
    save_steps=100,
    save_total_limit=2,
    logging_steps=100,
    run_name="matryoshka-nli",
)

# 6. train
trainer = SentenceTransformerTrainer(
    model=model,
    args=args,
    train_dataset=train_dataset,
    eval_dataset=eval_dataset,
    loss=train_loss,
    evaluator=dev_evaluator,
)
trainer.train()

# 7. STS-B test at every dimension
test_dataset = load_dataset("sentence-transformers/stsb", split="test")
evaluators = []
for dim in matryoshka_dims:
    evaluators.append(
        EmbeddingSimilarityEvaluator(
            sentences1=test_dataset["sentence1"],
            sentences2=test_dataset["sentence2"],
            scores=test_dataset["score"],
            main_similarity=SimilarityFunction.COSINE,
            name=f"sts-test-{dim}",
            truncate_dim=dim,
        )
    )
test_evaluator = SequentialEvaluator(evaluators)
test_evaluator(model)

# 8. the final model
final_output_dir = f"{output_dir}/final"
model.save(final_output_dir)

# 9. (optional) to the Hub
model_name = model_name if "/" not in model_name else model_name.split("/")[-1]
try:
    model.push_to_hub(f"{model_name}-nli-matryoshka")
except Exception:
    logging.error(f"Error uploading model to the Hugging Face Hub:\n{traceback.format_exc()}To upload it manually, "
                  f"run `huggingface-cli login`, then load the model from {final_output_dir!r} and push it.")
