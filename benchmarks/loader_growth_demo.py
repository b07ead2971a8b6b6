"""The DataLoader jobs of tests/capture/test_loader_growth.py, estimated (docs/capture.md's
"DataLoader loops whose live memory grows" figures):

    PYTHONPATH=src python benchmarks/loader_growth_demo.py KEEP [--steps all]

KEEP: logits, graph, steady, host_copy, small. Prints the steps, the allocated and device
peaks, the growth notes and the JSON's `step_growth` record (when there is one).
"""

from __future__ import annotations

import argparse
import json
import runpy
import tempfile
import textwrap
from pathlib import Path

from peakmem.estimate import estimate

JOB = """
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 4096)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(1024, 64), torch.randint(0, 4096, (1024,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    for epoch in range(2):
        all_preds = []
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            KEEP
            opt.step()
            opt.zero_grad()
        print("epoch", epoch, "kept", len(all_preds))
"""

KEEPS = {
    "logits": "loss.backward()\n            all_preds.append(logits)",
    "graph": "loss.backward(retain_graph=True)\n            all_preds.append(loss)",
    "steady": "loss.backward()\n            all_preds.append(logits.argmax(1).sum().item())",
    "host_copy": "loss.backward()\n            all_preds.append(logits.detach().cpu())",
    # 512 bytes a step (a 0-d loss on the device): 32 KiB over the epoch, below the 2 MiB bar
    "small": "loss.backward()\n            all_preds.append(loss.detach())",
}


def job_text(keep: str) -> str:
    return textwrap.dedent(JOB.replace("KEEP", KEEPS[keep]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("keep", choices=sorted(KEEPS))
    parser.add_argument("--steps", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.py"
        path.write_text(job_text(args.keep))
        kwargs = {} if args.steps is None else {"steps": args.steps}
        est = estimate(runpy.run_path, str(path), run_name="__main__", gpu="a100-40gb",
                       torch_version="2.4.1", **kwargs)
    print(json.dumps({"steps": est.steps, "peak_allocated_bytes": est.peak_allocated_bytes,
                      "peak_bytes": est.peak_bytes}))
    for note in est.capture.notes:
        if "grew" in note or "past the point" in note:
            print("note:", note)
    record = est.to_json().get("step_growth")
    if record is not None:
        print("step_growth:", json.dumps(record))


if __name__ == "__main__":
    main()
