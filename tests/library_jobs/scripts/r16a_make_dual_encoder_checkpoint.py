"""Write a tiny VisionTextDualEncoderModel (ViT + BERT towers, projections, logit scale) for
run_clip.py, as its README makes one (`from_vision_text_pretrained`, then `save_pretrained`):
`python r16a_make_dual_encoder_checkpoint.py OUT_DIR VISION_CONFIG_JSON TEXT_CONFIG_JSON`."""

import json
import sys

import torch

from peakmem.capture.vision_ops import declare_torchvision_ops

declare_torchvision_ops()  # transformers imports torchvision (README)

from transformers import AutoConfig, VisionTextDualEncoderConfig, VisionTextDualEncoderModel  # noqa: E402


def main():
    out, vision_file, text_file = sys.argv[1:4]
    configs = []
    for path in (vision_file, text_file):
        with open(path) as f:
            values = json.load(f)
        configs.append(AutoConfig.for_model(values.pop("model_type"), **values))
    torch.manual_seed(0)
    config = VisionTextDualEncoderConfig.from_vision_text_configs(*configs, projection_dim=32)
    VisionTextDualEncoderModel(config=config).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main()
