"""Write a tiny model checkpoint (config.json + model.safetensors) for the hf_ex_* scripts'
`--model_name_or_path`: `python hf_ex_make_checkpoint.py OUT_DIR CONFIG_JSON`.

CONFIG_JSON is a config.json the test wrote (its `model_type` picks the class); the base model
of that type is saved (task heads are added, newly initialized, by the script that loads it).
"""

import json
import sys

import torch

from peakmem.capture.vision_ops import declare_torchvision_ops

# transformers imports torchvision; on a CPU-only torch its compiled ops cannot load (README)
declare_torchvision_ops()

from transformers import AutoConfig, AutoModel  # noqa: E402


def main():
    out, config_file = sys.argv[1], sys.argv[2]
    with open(config_file) as f:
        values = json.load(f)
    torch.manual_seed(0)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    AutoModel.from_config(config).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main()
