"""xMem's Hugging Face training job (Stone-ResearchLife/xMem, `exp/trainer/trainer.py`
`ModelPreparer` + `exp/trainer/train_loop.py` `transformer_train_loop`), rebuilt without downloads.

What xMem ran (transformers 4.51.3, torch 2.6.0):
- the model: `AutoConfig.from_pretrained(name)` then `AutoModelFor*.from_config(config)`, random
  weights, `model.train()`; here the config values come from `hf_configs.py` (no download);
- the data: wikitext-2-raw-v1 tokenized with `truncation=True, max_length=128`, batched by a
  DataLoader with `DataCollatorForLanguageModeling(mlm=False)` (pads to the longest sequence of
  the batch; labels = input_ids with padding set to -100; the batch is input_ids, attention_mask,
  labels). Here: random token ids of `--seq-len` (128: a batch of wikitext-2 lines almost always
  holds one truncated to 128) with the same three keys; T5 gets the same batch (its decoder
  input is the labels shifted right, done by the model);
- the optimizer: `getattr(torch.optim, name)(params, lr=1e-3)` with the defaults (SGD without
  momentum); Adafactor with `relative_step=False`; StepLR (no device memory, left out);
- the loop: `zero_grad()` at the chosen point (mode 0: before the batch moves to the device,
  1: after the forward, 2: after the step), batch `.to(device)`, forward, `loss.backward()`,
  `optimizer.step()`, breaking after the step whose index equals `iterations` (3): 4 steps.

The installed transformers (5.x) builds the model; `--transformers 4.51` (the default) makes it
allocate as xMem's 4.51.3 did for the job's duration (`hf_451.py`: the cache keeps the first
key/value states, 4.51's SDPA function with contiguous inputs, GPT-2's causal bias buffers);
`--transformers installed` leaves the installed release as it is. An SDPA model gets no
`attention_mask` (`--all-ones-mask as-on-gpu`): on the GPU both releases read the all-ones mask
and drop it, where a capture (which reads device values as zeros) would build one per layer.

Plain PyTorch + transformers: `python benchmarks/zoo/xmem_hf.py --model gpt2 --batch-size 8`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _xmem import run_steps, xmem_main, xmem_parser  # noqa: E402
from hf_451 import transformers_451  # noqa: E402
from hf_configs import HFModel, lookup  # noqa: E402

OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adafactor", "RMSprop", "Adagrad")


def make_config(spec: HFModel):
    from transformers import AutoConfig

    config = AutoConfig.for_model(spec.model_type, **spec.values)
    # use_cache stays at the config default (True), as in xMem: the forward also returns the
    # key/value tensors, and `outputs` keeps them (and the logits) alive into the next forward.
    config._attn_implementation = spec.attn
    return config


def build_model(spec: HFModel) -> torch.nn.Module:
    import transformers

    auto = getattr(transformers, spec.model_class)
    # The configs carry no torch_dtype, so the weights are float32 (torch's default), as xMem's
    # were: e.g. its Llama-3.2-3B SGD batch-1 run peaked at 29 GB, twice the bf16 model states.
    return auto.from_config(make_config(spec))


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "Adafactor":
        from transformers import Adafactor

        return Adafactor(params, lr=lr, relative_step=False)
    return getattr(torch.optim, name)(params, lr=lr)


def make_batch(batch_size: int, seq_len: int, vocab: int) -> dict[str, torch.Tensor]:
    """What the causal-LM collator hands the loop (on the host): ids, mask, labels."""
    input_ids = torch.randint(0, vocab, (batch_size, seq_len))
    attention_mask = torch.ones(batch_size, seq_len, dtype=torch.long)
    labels = input_ids.clone()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def train(args: argparse.Namespace) -> float:
    spec = lookup(args.model)
    if spec is None:
        raise SystemExit(f"unknown model {args.model!r} (known: see hf_configs.py)")
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    with device:
        model = build_model(spec)
    model.to(device)
    model.train()
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr)
    vocab = model.config.vocab_size

    drop_mask = args.all_ones_mask == "as-on-gpu" and spec.attn == "sdpa"

    def forward(model, batch):
        if drop_mask:  # the mask is on the device (as in xMem's loop) but not read
            batch = {key: value for key, value in batch.items() if key != "attention_mask"}
        outputs = model(**batch)
        return outputs.loss, outputs

    def steps() -> float:
        return run_steps(args, model, optimizer,
                         lambda: make_batch(args.batch_size, args.seq_len, vocab), forward)

    if args.transformers == "installed":
        return steps()
    with transformers_451(model):
        return steps()


def parser() -> argparse.ArgumentParser:
    p = xmem_parser(__doc__.splitlines()[0], "Hub id as xMem records it (hf_configs.py)",
                    OPTIMIZERS)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--all-ones-mask", choices=("as-on-gpu", "pass"), default="as-on-gpu",
                   help="as-on-gpu: an SDPA model gets no attention_mask, as it would drop the "
                        "all-ones mask on the GPU after reading it (a capture reads zeros)")
    p.add_argument("--transformers", choices=("4.51", "installed"), default="4.51",
                   help="allocate as xMem's transformers 4.51.3 did (hf_451.py), or as the "
                        "installed release does")
    return p


if __name__ == "__main__":
    xmem_main(parser, train)
