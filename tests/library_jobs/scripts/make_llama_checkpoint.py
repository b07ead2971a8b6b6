"""Write a tiny LlamaForCausalLM checkpoint (config.json + model.safetensors) to a directory.

Run as a plain script, before the estimate: `python make_llama_checkpoint.py OUT_DIR`.
Its shape is TINY_LLAMA in tests/library_jobs/expected.py.
"""

import sys

import torch

from peakmem.capture.vision_ops import declare_torchvision_ops

# transformers imports torchvision; on a CPU-only torch its compiled ops cannot load (README)
declare_torchvision_ops()

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

TINY_LLAMA = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)


def main():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
    model.save_pretrained(sys.argv[1], safe_serialization=True)


if __name__ == "__main__":
    main()
