"""sentence-transformers' `examples/sentence_transformer/training/nli/training_nli_v2.py`
(huggingface/sentence-transformers, the v3+ training API), re-created to run offline.

`SentenceTransformer(model_name)` on a plain transformers checkpoint (a Transformer module and
mean pooling), AllNLI (anchor, positive, negative) triplets, `MultipleNegativesRankingLoss`, an
`EmbeddingSimilarityEvaluator` on STS-B pairs run before training, during it (`eval_steps`) and
on the test split after, `SentenceTransformerTrainingArguments` with fp16, the NO_DUPLICATES batch
sampler, step-wise evaluation and checkpoints, `SentenceTransformerTrainer.train()`, then
`model.save`. The original reads the sentence-transformers/all-nli and stsb data sets from the
Hub; here the same columns come from local JSON lines files (`--train-file`, ...), and the
original's fixed batch size, epoch count and step counts are options.
"""

import argparse
import logging
from datetime import datetime

from sentence_transformers import SentenceTransformer
from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator, SimilarityFunction
from sentence_transformers.losses import MultipleNegativesRankingLoss
from sentence_transformers.trainer import SentenceTransformerTrainer
from sentence_transformers.training_args import BatchSamplers, SentenceTransformerTrainingArguments

from datasets import load_dataset

logging.basicConfig(format="%(asctime)s - %(message)s", datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO)


def sts_evaluator(path: str, name: str) -> EmbeddingSimilarityEvaluator:
    sts = load_dataset("json", data_files=path, split="train")
    return EmbeddingSimilarityEvaluator(sentences1=sts["sentence1"], sentences2=sts["sentence2"],
                                        scores=sts["score"], main_similarity=SimilarityFunction.COSINE,
                                        name=name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_name")
    parser.add_argument("--train-file", required=True, help="anchor / positive / negative")
    parser.add_argument("--dev-file", required=True, help="anchor / positive / negative")
    parser.add_argument("--sts-file", required=True, help="sentence1 / sentence2 / score")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-seq-length", type=int, default=75)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--eval-steps", type=int, default=10)
    args = parser.parse_args()

    output_dir = "output/training_nli_v2_" + args.model_name.replace("/", "-") + "-" + datetime.now().strftime("%Y-%m-%d_%H-%M-%S")

    # 1. a Transformer module and mean pooling when the checkpoint is not a Sentence Transformer
    model = SentenceTransformer(args.model_name)
    model.max_seq_length = args.max_seq_length

    # 2. AllNLI triplets
    train_dataset = load_dataset("json", data_files=args.train_file, split="train")
    eval_dataset = load_dataset("json", data_files=args.dev_file, split="train")
    logging.info(train_dataset)

    # 3. in-batch negatives plus the hard negative of each triplet
    train_loss = MultipleNegativesRankingLoss(model)

    # 4. STS-B dev evaluator, also run once before training
    dev_evaluator = sts_evaluator(args.sts_file, "sts-dev")
    logging.info("Evaluation before training:")
    dev_evaluator(model)

    # 5. training arguments
    training_args = SentenceTransformerTrainingArguments(
        output_dir=output_dir,
        num_train_epochs=1,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        warmup_steps=0.1,
        fp16=True,
        bf16=False,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        eval_strategy="steps",
        eval_steps=args.eval_steps,
        save_strategy="steps",
        save_steps=args.eval_steps,
        save_total_limit=2,
        logging_steps=100,
        run_name="nli-v2",
        report_to="none",
    )

    # 6. train
    trainer = SentenceTransformerTrainer(model=model, args=training_args, train_dataset=train_dataset,
                                         eval_dataset=eval_dataset, loss=train_loss, evaluator=dev_evaluator)
    trainer.train()

    # 7. STS-B test evaluation, 8. save
    test_evaluator = sts_evaluator(args.sts_file, "sts-test")
    print("sts-test:", test_evaluator(model))
    model.save(f"{output_dir}/final")


if __name__ == "__main__":
    main()
