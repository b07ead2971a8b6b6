"""Speed of an estimate against ONE real CPU training iteration of the same job.

    python benchmarks/estimate_speed.py [--model gpt2] [--batch-size 4] [--seq-len 512]

Times `peakmem estimate` of `benchmarks/zoo/transformers_lm.py` (AdamW, fp32) end to end in this
process, then one real training iteration of the same model on the CPU (model built, a warm-up
iteration excluded), and prints both and their ratio as JSON. Target (issue 3): ratio <= 0.5.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ZOO = Path(__file__).resolve().parent / "zoo"


def real_iteration_seconds(model_name: str, batch: int, seq: int) -> float:
    import torch

    from peakmem.capture import vision_ops

    # transformers imports torchvision when it is installed; its compiled ops cannot load next
    # to a CPU-only torch (peakmem declares their schemas, as a capture does)
    vision_ops.declare_torchvision_ops()
    sys.path.insert(0, str(ZOO))
    import transformers_lm  # noqa: PLC0415

    args = argparse.Namespace(model=model_name, num_layers=None, hidden_size=None, num_heads=None,
                              intermediate_size=None, vocab_size=None, attn="sdpa")
    model = transformers_lm.build(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    times = []
    for _ in range(2):  # the first iteration also allocates the optimizer state
        start = time.perf_counter()
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args()
    from peakmem.estimate import estimate_command

    command = ["python", str(ZOO / "transformers_lm.py"), "--model", args.model, "--optimizer",
               "adamw", "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    start = time.perf_counter()
    result = estimate_command(command, gpu="h100-80gb")
    estimate_seconds = time.perf_counter() - start
    iteration = real_iteration_seconds(args.model, args.batch_size, args.seq_len)
    print(json.dumps({
        "job": " ".join(command[1:]),
        "estimate_seconds": round(estimate_seconds, 2),
        "estimate_steps": result.steps,
        "real_cpu_iteration_seconds": round(iteration, 2),
        "ratio": round(estimate_seconds / iteration, 3),
        "peak_bytes": result.peak_bytes,
    }))


if __name__ == "__main__":
    main()
