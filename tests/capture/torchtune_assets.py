"""A tiny local Llama 3.2 for torchtune's recipes: a Hugging Face checkpoint (safetensors +
config.json with Hugging Face's key names), a byte-level tiktoken tokenizer with the Llama 3 special
tokens, an instruct dataset in JSON and a recipe config, all under one directory.

`tune run lora_finetune_single_device --config <dir>/lora.yaml` and
`tune run full_finetune_single_device --config <dir>/full.yaml` then run without a network."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

VOCAB = 512
LAYERS = 2
HEADS = 4
KV_HEADS = 2
EMBED = 64
HIDDEN = 128
SEQ = 64
# Llama 3's special tokens, numbered right after the 256 byte tokens
SPECIAL_TOKENS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
    "<|image|>", "<|video|>",
)


@dataclass(frozen=True)
class TinyLlama:
    root: Path
    lora_config: Path
    full_config: Path


def write_tokenizer(root: Path) -> tuple[Path, Path]:
    model = root / "tokenizer.model"  # tiktoken's format: base64 token, rank
    model.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n"
                             for b in range(256)))
    special = root / "tokenizer.json"
    special.write_text(json.dumps({"added_tokens": [
        {"id": 256 + i, "content": token} for i, token in enumerate(SPECIAL_TOKENS)]}))
    return model, special


@dataclass(frozen=True)
class Dims:
    """A Llama 3.2's sizes, as torchtune's `llama3_2` / `lora_llama3_2` builders take them."""

    vocab_size: int = VOCAB
    num_layers: int = LAYERS
    num_heads: int = HEADS
    num_kv_heads: int = KV_HEADS
    embed_dim: int = EMBED
    intermediate_dim: int = HIDDEN
    max_seq_len: int = SEQ * 4

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def overrides(self, node: str) -> list[str]:
        """`tune run` key=value overrides giving the config node `node` these sizes."""
        return [f"{node}.{name}={value}" for name, value in vars(self).items()]


def write_checkpoint(root: Path, dims: Dims = Dims(), name: str = "checkpoint") -> Path:
    """A Hugging Face Llama checkpoint: model.safetensors (bf16, HF key names, tied output)
    and config.json (what torchtune's FullModelHFCheckpointer reads)."""
    import torch
    from safetensors.torch import save_file

    directory = root / name
    directory.mkdir()
    head_dim, generator = dims.head_dim, torch.Generator().manual_seed(0)
    embed, hidden = dims.embed_dim, dims.intermediate_dim
    heads, kv_heads = dims.num_heads, dims.num_kv_heads

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": weight(dims.vocab_size, embed),
               "model.norm.weight": torch.ones(embed, dtype=torch.bfloat16)}
    for layer in range(dims.num_layers):
        prefix = f"model.layers.{layer}."
        tensors.update({
            prefix + "self_attn.q_proj.weight": weight(heads * head_dim, embed),
            prefix + "self_attn.k_proj.weight": weight(kv_heads * head_dim, embed),
            prefix + "self_attn.v_proj.weight": weight(kv_heads * head_dim, embed),
            prefix + "self_attn.o_proj.weight": weight(embed, heads * head_dim),
            prefix + "mlp.gate_proj.weight": weight(hidden, embed),
            prefix + "mlp.up_proj.weight": weight(hidden, embed),
            prefix + "mlp.down_proj.weight": weight(embed, hidden),
            prefix + "input_layernorm.weight": torch.ones(embed, dtype=torch.bfloat16),
            prefix + "post_attention_layernorm.weight": torch.ones(embed, dtype=torch.bfloat16),
        })
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": dims.vocab_size, "hidden_size": embed, "intermediate_size": hidden,
        "num_hidden_layers": dims.num_layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "max_position_embeddings": dims.max_seq_len, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16"}))
    return directory


def write_instruct_data(root: Path, rows: int) -> Path:
    path = root / "data.json"
    path.write_text(json.dumps([
        {"input": f"add {i} and {i + 1}, then say why " * 2, "output": f"{2 * i + 1} because"}
        for i in range(rows)]))
    return path


def _config(root: Path, tokenizer: tuple[Path, Path], checkpoint: Path, data: Path, *,
            lora: bool, batch_size: int, steps: int) -> str:
    model = ("""model:
  _component_: torchtune.models.llama3_2.lora_llama3_2
  lora_attn_modules: ['q_proj', 'v_proj']
  apply_lora_to_mlp: False
  lora_rank: 8
  lora_alpha: 16
  lora_dropout: 0.0
""" if lora else """model:
  _component_: torchtune.models.llama3_2.llama3_2
""") + f"""  vocab_size: {VOCAB}
  num_layers: {LAYERS}
  num_heads: {HEADS}
  num_kv_heads: {KV_HEADS}
  embed_dim: {EMBED}
  max_seq_len: {SEQ * 4}
  intermediate_dim: {HIDDEN}
"""
    recipe_only = ("save_adapter_weights_only: False\n" if lora
                   else "optimizer_in_bwd: False\n")
    return f"""output_dir: {root}/output
{model}
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: {tokenizer[0]}
  special_tokens_path: {tokenizer[1]}
  max_seq_len: {SEQ}
checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
  checkpoint_dir: {checkpoint}
  checkpoint_files: [model.safetensors]
  recipe_checkpoint: null
  output_dir: ${{output_dir}}
  model_type: LLAMA3_2
resume_from_checkpoint: False
{recipe_only}
dataset:
  _component_: torchtune.datasets.instruct_dataset
  source: json
  data_files: {data}
  split: train
  packed: False
seed: 0
shuffle: True
batch_size: {batch_size}
optimizer:
  _component_: torch.optim.AdamW
  fused: True
  lr: 2e-5
lr_scheduler:
  _component_: torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup
  num_warmup_steps: 1
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
epochs: 1
max_steps_per_epoch: {steps}
gradient_accumulation_steps: 1
clip_grad_norm: null
compile: False
metric_logger:
  _component_: torchtune.training.metric_logging.DiskLogger
  log_dir: ${{output_dir}}/logs
log_every_n_steps: 1
log_peak_memory_stats: True
device: cuda
dtype: bf16
enable_activation_checkpointing: False
enable_activation_offloading: False
profiler:
  _component_: torchtune.training.setup_torch_profiler
  enabled: False
"""


def tiny_llama(root: Path, *, batch_size: int = 4, steps: int = 3, rows: int = 32) -> TinyLlama:
    """Write the checkpoint, tokenizer, data and both recipe configs under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(root)
    checkpoint = write_checkpoint(root)
    data = write_instruct_data(root, rows)
    paths = {}
    for name, lora in (("lora", True), ("full", False)):
        paths[name] = root / f"{name}.yaml"
        paths[name].write_text(_config(root, tokenizer, checkpoint, data, lora=lora,
                                       batch_size=batch_size, steps=steps))
    return TinyLlama(root, paths["lora"], paths["full"])
