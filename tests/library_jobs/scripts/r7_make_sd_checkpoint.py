"""Write a tiny Stable-Diffusion-layout pipeline folder for the diffusers text-to-image scripts:
`python r7_make_sd_checkpoint.py OUT_DIR [VAE_BLOCKS]`.

VAE_BLOCKS (default 2) sets the VAE's depth, and with it its downsampling: 2 ** (VAE_BLOCKS - 1);
4 gives Stable Diffusion's factor 8, which ControlNet's conditioning embedding (three stride-2
convolutions) assumes.

unet/ (UNet2DConditionModel), vae/ (AutoencoderKL), text_encoder/ (CLIPTextModel), tokenizer/
(a byte-level CLIPTokenizer vocabulary without merges), scheduler/ (DDPMScheduler) and
model_index.json, as `StableDiffusionPipeline.save_pretrained` writes them (no safety checker).
shapes.json lists each component's parameter shapes, as the models built from these configs
hold them, for the tests' expected bytes, and those of `ControlNetModel.from_unet(unet)`
(train_controlnet.py's ControlNet).
"""

import json
import sys
from pathlib import Path

import torch

from peakmem.capture.vision_ops import declare_torchvision_ops

# transformers imports torchvision; on a CPU-only torch its compiled ops cannot load (README)
declare_torchvision_ops()

from diffusers import (  # noqa: E402
    AutoencoderKL,
    ControlNetModel,
    DDPMScheduler,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

TEXT_HIDDEN = 32


def byte_vocab() -> dict[str, int]:
    """CLIP's byte-level symbols, each alone and as a word end; no merges."""
    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    return {token: i for i, token in enumerate(tokens)}


def main():
    out = Path(sys.argv[1])
    vae_blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.manual_seed(0)
    tokenizer = CLIPTokenizer(vocab=byte_vocab(), merges=[], model_max_length=16)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, projection_dim=TEXT_HIDDEN,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=1))
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * vae_blocks,
                        up_block_types=["UpDecoderBlock2D"] * vae_blocks,
                        block_out_channels=[16, 32] + [32] * (vae_blocks - 2),
                        latent_channels=4, layers_per_block=1, norm_num_groups=8, sample_size=16)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(32, 64), norm_num_groups=8,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                cross_attention_dim=TEXT_HIDDEN, attention_head_dim=8)
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear",
                              beta_start=0.00085, beta_end=0.012, clip_sample=False)
    pipeline = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                       scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
    pipeline.save_pretrained(out)
    shapes = {name: [list(p.shape) for p in model.parameters()]
              for name, model in (("unet", unet), ("vae", vae), ("text_encoder", text_encoder),
                                  ("controlnet", ControlNetModel.from_unet(unet)))}
    (out / "shapes.json").write_text(json.dumps(shapes))


if __name__ == "__main__":
    main()
