"""Write a tiny T5ForConditionalGeneration checkpoint (config.json + model.safetensors) to a
directory: `python make_t5_checkpoint.py OUT_DIR`. Its shape is TINY_T5_CONFIG in
tests/library_jobs/test_library_jobs_hf.py (t5_shapes)."""

import json
import sys

import torch

from peakmem.capture.vision_ops import declare_torchvision_ops

# transformers imports torchvision; on a CPU-only torch its compiled ops cannot load (README)
declare_torchvision_ops()

from transformers import T5Config, T5ForConditionalGeneration  # noqa: E402


def main():
    out, config = sys.argv[1], json.loads(sys.argv[2])
    torch.manual_seed(0)
    config = {key: value for key, value in config.items() if key != "model_type"}
    T5ForConditionalGeneration(T5Config(**config)).save_pretrained(out)


if __name__ == "__main__":
    main()
