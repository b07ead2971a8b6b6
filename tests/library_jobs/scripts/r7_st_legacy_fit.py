"""sentence-transformers' pre-v3 NLI training (`examples/training/nli/training_nli_v2.py` as it
was before v3.0, still the most copied sentence-transformers script), re-created to run
offline: `models.Transformer` + `models.Pooling` built by hand, AllNLI triplets as
`InputExample`s, `datasets.NoDuplicatesDataLoader`, `losses.MultipleNegativesRankingLoss`, an
`EmbeddingSimilarityEvaluator` from InputExamples, and the legacy `model.fit(train_objectives=...,
evaluator=..., epochs=..., evaluation_steps=..., warmup_steps=..., output_path=...,
use_amp=True)`, which v3+ runs through the SentenceTransformerTrainer behind the scenes.
The data come from local JSON lines files instead of the downloaded AllNLI / STS-B TSV files.
"""

import argparse
import json
import logging
import math
from datetime import datetime

from sentence_transformers import InputExample, SentenceTransformer, datasets, losses, models
from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator

logging.basicConfig(format="%(asctime)s - %(message)s", datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_name")
    parser.add_argument("--train-file", required=True, help="anchor / positive / negative")
    parser.add_argument("--sts-file", required=True, help="sentence1 / sentence2 / score")
    parser.add_argument("--train-batch-size", type=int, default=128)
    parser.add_argument("--max-seq-length", type=int, default=75)
    parser.add_argument("--num-epochs", type=int, default=1)
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    args = parser.parse_args()

    model_save_path = "output/training_nli_v2_" + args.model_name.replace("/", "-") + "-" + datetime.now().strftime("%Y-%m-%d_%H-%M-%S")

    # the word embedding model (a transformers checkpoint) and mean pooling over its tokens
    word_embedding_model = models.Transformer(args.model_name, max_seq_length=args.max_seq_length)
    pooling_model = models.Pooling(word_embedding_model.get_word_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[word_embedding_model, pooling_model])

    # (anchor, entailment, contradiction) triplets; MNRL also uses the other rows as negatives
    train_samples = [InputExample(texts=[row["anchor"], row["positive"], row["negative"]])
                     for row in read_jsonl(args.train_file)]
    logging.info("Train samples: %d", len(train_samples))
    # special data loader that avoids duplicate sentences in one batch
    train_dataloader = datasets.NoDuplicatesDataLoader(train_samples, batch_size=args.train_batch_size)
    train_loss = losses.MultipleNegativesRankingLoss(model)

    dev_samples = [InputExample(texts=[row["sentence1"], row["sentence2"]], label=row["score"] / 5.0)
                   for row in read_jsonl(args.sts_file)]
    dev_evaluator = EmbeddingSimilarityEvaluator.from_input_examples(dev_samples, batch_size=args.train_batch_size,
                                                                     name="sts-dev")

    # 10% of the training data for warm-up
    warmup_steps = math.ceil(len(train_dataloader) * args.num_epochs * 0.1)
    logging.info("Warmup-steps: %d", warmup_steps)

    model.fit(
        train_objectives=[(train_dataloader, train_loss)],
        evaluator=dev_evaluator,
        epochs=args.num_epochs,
        steps_per_epoch=args.steps_per_epoch,
        evaluation_steps=int(len(train_dataloader) * 0.1),
        warmup_steps=warmup_steps,
        output_path=model_save_path,
        use_amp=True,  # fp16
    )
    print("sts-dev after training:", dev_evaluator(model))


if __name__ == "__main__":
    main()
