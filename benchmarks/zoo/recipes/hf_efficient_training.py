"""Hugging Face's "Efficient Training on a Single GPU" recipes (transformers docs,
perf_train_gpu_one, v4.18-v4.2x), rebuilt: bert-large-uncased for sequence classification with
`Trainer` (eager attention, per-parameter AdamW and gradients zeroed, not freed, as then), 512 random sequences of 512 tokens, one epoch, and the page's variants (batch size,
gradient accumulation, gradient checkpointing, fp16, Adafactor, bitsandbytes 8-bit Adam with the
page's two parameter groups).

    python benchmarks/zoo/recipes/hf_efficient_training.py --batch 1 --accum 4 --checkpointing --fp16

The model is built from bert-large-uncased's configuration (no download): what the page loaded
with `from_pretrained("bert-large-uncased").to("cuda")` has the same shapes. The page's dataset had
no attention mask; its BertModel (transformers 4.1x) then made one of ones and always added the
extended mask, `(1.0 - mask) * -10000.0` in the model's dtype (fp32), to the attention scores
(`get_extended_attention_mask`), so under fp16 autocast the scores became fp32 before the softmax.
Today's BertModel skips an all-ones mask; the dataset gives the extended mask itself (zeros,
[1, 1, seq] per sample, fp32), which today's `create_bidirectional_mask` passes through as a
prepared 4D mask. The page's
`evaluation_strategy="steps"` never evaluated (no eval dataset, 128 steps < 500): left out.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch

# bert-large-uncased's config.json (hidden 1024, 24 layers, 16 heads, FFN 4096, vocab 30522)
BERT_LARGE = dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                  num_attention_heads=16, intermediate_size=4096, max_position_embeddings=512,
                  type_vocab_size=2)


def build_optimizer(name: str, model: torch.nn.Module, args):
    """The page's 8-bit Adam (decay / no-decay groups, TrainingArguments' betas, eps and lr), or
    AdamW as the page's Trainer ran it: one parameter at a time (transformers 4.2x's default
    `adamw_hf`, like torch 1.10's AdamW; today's default is foreach or fused). None: Adafactor
    from TrainingArguments."""
    if name == "adafactor":
        return None
    from transformers.trainer_pt_utils import get_parameter_names

    decay = [n for n in get_parameter_names(model, [torch.nn.LayerNorm]) if "bias" not in n]
    groups = [
        {"params": [p for n, p in model.named_parameters() if n in decay],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if n not in decay],
         "weight_decay": 0.0},
    ]
    hyper = dict(betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                 lr=args.learning_rate)
    if name == "adamw":
        return torch.optim.AdamW(groups, foreach=False, **hyper)
    import bitsandbytes as bnb

    return bnb.optim.Adam8bit(groups, **hyper)


def zero_grad_as_torch_1x() -> None:
    """The page ran torch 1.x, whose `Module.zero_grad()` / `Optimizer.zero_grad()` filled the
    gradients with zeros (`set_to_none=False` by default until torch 2.0): they stay allocated
    through the next forward and backward. `Trainer` calls both without the argument."""
    for owner in (torch.nn.Module, torch.optim.Optimizer):
        original = owner.zero_grad

        def zero_grad(self, set_to_none: bool = False, _original=original) -> None:
            _original(self, set_to_none=set_to_none)

        owner.zero_grad = zero_grad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--optim", choices=("adamw", "adafactor", "adam8bit"), default="adamw")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--layers", type=int, default=BERT_LARGE["num_hidden_layers"])
    cli = parser.parse_args()
    zero_grad_as_torch_1x()

    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from datasets import Dataset

    data = {"input_ids": np.random.randint(100, 30000, (cli.samples, cli.seq_len)),
            "labels": np.random.randint(0, 1, (cli.samples,)),
            # transformers 4.1x's extended mask of an all-ones mask: added to every layer's scores
            "attention_mask": np.zeros((cli.samples, 1, 1, cli.seq_len), dtype=np.float32)}
    ds = Dataset.from_dict(data)
    ds.set_format("pt")
    # the page's transformers (4.1x-4.2x) had only eager attention: the scores materialised
    config = BertConfig(**{**BERT_LARGE, "num_hidden_layers": cli.layers})
    config._attn_implementation = "eager"
    model = BertForSequenceClassification(config).to("cuda")
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(), num_train_epochs=1, log_level="error", report_to="none",
        save_strategy="no", per_device_train_batch_size=cli.batch,
        gradient_accumulation_steps=cli.accum, gradient_checkpointing=cli.checkpointing,
        fp16=cli.fp16, optim="adafactor" if cli.optim == "adafactor" else "adamw_torch",
    )
    optimizer = build_optimizer(cli.optim, model, args)
    trainer = Trainer(model=model, args=args, train_dataset=ds, optimizers=(optimizer, None))
    trainer.train()


if __name__ == "__main__":
    main()
