"""Round 17a: torchtune's recipes run as people run them,
`peakmem estimate --gpu h100-80gb --json -- tune run RECIPE --config BUILTIN_CONFIG key=value ...`:
the built-in config of a Llama 3.2 1B / Llama 3.1 8B recipe, unmodified, pointed by key=value
overrides at a tiny local Llama 3.2 (the builder `torchtune.models.llama3_2.(lora_)llama3_2` with
small sizes, a Hugging Face checkpoint read by FullModelHFCheckpointer, a byte-level tiktoken
tokenizer and JSON datasets: tests/capture/torchtune_assets.py), 3 steps, no network.

- full_finetune_single_device, `llama3_2/1B_full_single_device` as shipped: bitsandbytes'
  PagedAdamW8bit stepped in backward (`optimizer_in_bwd: True`); with `torch.optim.AdamW` and
  `optimizer_in_bwd=False`, then `optimizer_in_bwd=True enable_activation_checkpointing=True`.
- lora_finetune_single_device, `llama3_2/1B_lora_single_device` with `compile=True`, launched as
  `python -m torchtune._cli.tune run ...` (the `tune` console script's module).
- lora_finetune_single_device, `llama3_2/1B_qlora_single_device` (QLoRA: NF4 base weights; torchao
  quantizes in blocks of 64 with scalers in blocks of 256, so each weight needs a multiple of
  16384 elements: its own, larger tiny model). Failed before: loading the checkpoint into the
  NF4 weights (`NF4Tensor.copy_` of a host bf16 tensor) raised "PyTorch is not linked with
  support for cuda devices": torchao made the NF4 wrapper on the device its bf16 source reported
  (`cuda`), and CPU-only torch refuses `copy_` into a cuda tensor (capture/library_patches.py:
  wrappers made for the device are meta; tests/capture/test_subclass_storages.py).
- knowledge_distillation_single_device, `llama3_2/8B_to_1B_KD_lora_single_device`: a LoRA
  student and a frozen teacher from their own checkpointers.
- lora_dpo_single_device, `llama3_1/8B_lora_dpo_single_device`: a JSON preference dataset
  (chosen / rejected conversations), the reference model being the policy with its adapters
  disabled. Failed before: the recipe saves its checkpoint at the end of the (shortened) epoch
  and logs `os.path.getsize(output_path)` of the file peakmem diverted to its scratch directory
  (capture/side_effects.py: `getsize` of a diverted save now reads its copy;
  tests/capture/test_side_effects.py).

Parameter and optimizer-state bytes are worked out from the configs (expected.py): bf16 weights,
LoRA adapters A (rank x in) and B (out x rank), fused AdamW's two bf16 moments per trained tensor
plus its fp32 step scalar on the device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.capture.torchtune_assets import (
    Dims,
    write_checkpoint,
    write_instruct_data,
    write_tokenizer,
)
from tests.capture.torchtune_env import torchtune_pythonpath
from tests.library_jobs import expected as ex

pytestmark = pytest.mark.slow

TORCHTUNE_PATH = torchtune_pythonpath()  # skips the module where torchtune cannot run
SRC = Path(__file__).resolve().parents[2] / "src"

DIMS = Dims()  # vocab 512, 2 layers, 4 heads (2 kv), embed 64, intermediate 128
QDIMS = Dims(num_kv_heads=4, embed_dim=128, intermediate_dim=256)
"""Every QLoRA base weight a multiple of 16384 elements (NF4's blocks)."""
STEPS = 3


def base_shapes(dims: Dims) -> list[tuple[int, ...]]:
    """torchtune's Llama 3.2: the output projection is the token embedding (tied)."""
    return ex.llama_shapes(dims.vocab_size, dims.embed_dim, dims.intermediate_dim,
                           dims.num_layers, dims.num_heads, dims.num_kv_heads)[:-1]


def adapter_shapes(dims: Dims, rank: int, mlp: bool) -> list[tuple[int, ...]]:
    """LoRA on q_proj, v_proj and output_proj (the configs' lora_attn_modules), and on the
    three MLP projections with apply_lora_to_mlp."""
    e, h, kv = dims.embed_dim, dims.intermediate_dim, dims.num_kv_heads * dims.head_dim
    layer = [(rank, e), (e, rank), (rank, e), (kv, rank), (rank, e), (e, rank)]
    if mlp:
        layer += [(rank, e), (h, rank), (rank, e), (h, rank), (rank, h), (e, rank)]
    return layer * dims.num_layers


def fused_adamw_state(shapes: list[tuple[int, ...]]) -> int:
    """exp_avg and exp_avg_sq in the parameters' bf16, and a fp32 `step` per tensor on the
    device (torch.optim.AdamW(fused=True))."""
    return 2 * ex.device_bytes(shapes, ex.BF16) + ex.rounded(4) * len(shapes)


def nf4_bytes(shape: tuple[int, int]) -> int:
    """torchao's NF4Tensor of a bf16 weight, its inner tensors one allocation each: 4-bit
    codes (uint8, two per byte), int8 scalers per block of 64, fp32 factors per 256 scalers,
    the fp32 scaler mean and the 16-entry fp32 NF4 table."""
    n = shape[0] * shape[1]
    return (ex.rounded(n // 2) + ex.rounded(n // 64) + ex.rounded(4 * n // 64 // 256)
            + ex.rounded(4) + ex.rounded(4 * 16))


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tune_r17a")
    write_tokenizer(root)
    write_checkpoint(root, DIMS)
    write_checkpoint(root, QDIMS, name="qcheckpoint")
    write_instruct_data(root, rows=32)
    (root / "preference.json").write_text(json.dumps([
        {"chosen": [{"role": "user", "content": f"add {i} and {i + 1}, then say why"},
                    {"role": "assistant", "content": f"{2 * i + 1} because"}],
         "rejected": [{"role": "user", "content": f"add {i} and {i + 1}, then say why"},
                      {"role": "assistant", "content": "no idea at all"}]}
        for i in range(32)]))
    return root


def common(root: Path, checkpoint: str = "checkpoint") -> list[str]:
    """What a user overrides to run a built-in config on local files."""
    return [
        f"output_dir={root}/out", f"tokenizer.path={root}/tokenizer.model",
        f"tokenizer.special_tokens_path={root}/tokenizer.json", "tokenizer.max_seq_len=64",
        f"checkpointer.checkpoint_dir={root}/{checkpoint}",
        "checkpointer.checkpoint_files=[model.safetensors]", "checkpointer.model_type=LLAMA3_2",
        "batch_size=4", "epochs=1", f"max_steps_per_epoch={STEPS}",
        "gradient_accumulation_steps=1", "seed=0",
    ]


def instruct(root: Path) -> list[str]:
    return ["dataset._component_=torchtune.datasets.instruct_dataset", "dataset.source=json",
            f"dataset.data_files={root}/data.json", "dataset.split=train"]


def lora_model(dims: Dims, node: str = "model") -> list[str]:
    return [f"{node}._component_=torchtune.models.llama3_2.lora_llama3_2",
            *dims.overrides(node)]


def full_model(dims: Dims, node: str = "model") -> list[str]:
    return [f"{node}._component_=torchtune.models.llama3_2.llama3_2", *dims.overrides(node)]


def tune(root: Path, *command: str, timeout: float = 240) -> dict:
    """`python -m peakmem estimate --gpu h100-80gb --json -- COMMAND` in `root`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (TORCHTUNE_PATH, str(SRC), env.get("PYTHONPATH", "")) if p)
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_CACHE=str(root / "datasets_cache"))
    done = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--gpu", "h100-80gb", "--json",
         "--timeout", str(timeout), "--", *command],
        capture_output=True, text=True, env=env, cwd=root, timeout=timeout + 120)
    data = json.loads(done.stdout) if done.stdout.strip() else {}
    assert done.returncode == 0 and "error" not in data, (data.get("error"),
                                                          done.stderr[-3000:])
    assert data["steps"] == STEPS and data["estimate_kind"] == "training"
    return data


def _recipe_note(data: dict, recipe: str) -> None:
    assert data["notes"][0].startswith(f"tune run: recipe {recipe} ("), data["notes"][0]


# full_finetune_single_device ------------------------------------------------------------------


@pytest.fixture(scope="module")
def full(assets) -> dict[str, dict]:
    run = ("tune", "run", "full_finetune_single_device", "--config",
           "llama3_2/1B_full_single_device", *common(assets), *instruct(assets),
           *full_model(DIMS))
    adamw = ("optimizer._component_=torch.optim.AdamW", "optimizer.fused=True")
    return {
        "shipped": tune(assets, *run),
        "adamw": tune(assets, *run, *adamw, "optimizer_in_bwd=False"),
        "adamw_in_bwd_ac": tune(assets, *run, *adamw, "optimizer_in_bwd=True",
                                "enable_activation_checkpointing=True"),
    }


def test_full_finetune_parameters_and_adamw_state_from_the_config(full):
    shapes = base_shapes(DIMS)
    for name in ("adamw", "adamw_in_bwd_ac"):
        breakdown = full[name]["breakdown"]
        _recipe_note(full[name], "full_finetune_single_device")
        assert breakdown["parameter"] == ex.device_bytes(shapes, ex.BF16), name
        assert breakdown["optimizer_state"] == fused_adamw_state(shapes), name


def test_full_finetune_activation_checkpointing_saves_activations(full):
    plain, checkpointed = full["adamw"]["breakdown"], full["adamw_in_bwd_ac"]["breakdown"]
    assert checkpointed["activation"] < plain["activation"] / 2


def test_full_finetune_as_shipped_paged_adamw8bit_in_backward(full):
    data = full["shipped"]
    _recipe_note(data, "full_finetune_single_device")
    breakdown = data["breakdown"]
    assert breakdown["parameter"] == ex.device_bytes(base_shapes(DIMS), ex.BF16)
    # 8-bit moments (fp32 ones for tensors under 4096 elements) stay below AdamW's bf16 pair
    assert 0 < breakdown.get("optimizer_state", 0) < full["adamw"]["breakdown"]["optimizer_state"]


# lora_finetune_single_device: LoRA (compiled) and QLoRA ------------------------------------------


def test_lora_compiled_through_the_console_scripts_module(assets):
    data = tune(assets, sys.executable, "-m", "torchtune._cli.tune", "run",
                "lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
                *common(assets), *instruct(assets), *lora_model(DIMS), "compile=True")
    _recipe_note(data, "lora_finetune_single_device")
    adapters = adapter_shapes(DIMS, rank=64, mlp=True)
    breakdown = data["breakdown"]
    assert breakdown["parameter"] == (ex.device_bytes(base_shapes(DIMS), ex.BF16)
                                      + ex.device_bytes(adapters, ex.BF16))
    # only the adapters train: AdamW's state is theirs alone
    assert breakdown["optimizer_state"] == fused_adamw_state(adapters)
    assert any("torch.compile" in note for note in data["notes"])


def test_qlora_nf4_base_weights_and_adapter_only_state(assets):
    data = tune(assets, "tune", "run", "lora_finetune_single_device", "--config",
                "llama3_2/1B_qlora_single_device", *common(assets, "qcheckpoint"),
                *instruct(assets), *lora_model(QDIMS), "model.quantize_base=True")
    _recipe_note(data, "lora_finetune_single_device")
    d = QDIMS
    kv = d.num_kv_heads * d.head_dim
    quantized = [(d.embed_dim, d.embed_dim), (kv, d.embed_dim), (kv, d.embed_dim),
                 (d.embed_dim, d.embed_dim), (d.intermediate_dim, d.embed_dim),
                 (d.intermediate_dim, d.embed_dim), (d.embed_dim, d.intermediate_dim)]
    # the embedding (tied output) and the norms stay bf16
    kept = [(d.vocab_size, d.embed_dim)] + [(d.embed_dim,)] * (2 * d.num_layers + 1)
    adapters = adapter_shapes(QDIMS, rank=64, mlp=True)
    breakdown = data["breakdown"]
    assert breakdown["parameter"] == (d.num_layers * sum(nf4_bytes(s) for s in quantized)
                                      + ex.device_bytes(kept, ex.BF16)
                                      + ex.device_bytes(adapters, ex.BF16))
    assert breakdown["optimizer_state"] == fused_adamw_state(adapters)


# knowledge_distillation_single_device ---------------------------------------------------------


def test_knowledge_distillation_student_adapters_and_frozen_teacher(assets):
    data = tune(assets, "tune", "run", "knowledge_distillation_single_device", "--config",
                "llama3_2/8B_to_1B_KD_lora_single_device", *common(assets), *instruct(assets),
                *lora_model(DIMS), *full_model(DIMS, "teacher_model"),
                f"teacher_checkpointer.checkpoint_dir={assets}/checkpoint",
                "teacher_checkpointer.checkpoint_files=[model.safetensors]",
                "teacher_checkpointer.model_type=LLAMA3_2")
    _recipe_note(data, "knowledge_distillation_single_device")
    base = ex.device_bytes(base_shapes(DIMS), ex.BF16)
    adapters = adapter_shapes(DIMS, rank=64, mlp=True)
    breakdown = data["breakdown"]
    # the student (base + adapters) and the teacher, both bf16
    assert breakdown["parameter"] == 2 * base + ex.device_bytes(adapters, ex.BF16)
    assert breakdown["optimizer_state"] == fused_adamw_state(adapters)


# lora_dpo_single_device -----------------------------------------------------------------------


def test_lora_dpo_preference_pairs_and_its_end_of_epoch_checkpoint(assets):
    data = tune(assets, "tune", "run", "lora_dpo_single_device", "--config",
                "llama3_1/8B_lora_dpo_single_device", *common(assets), *lora_model(DIMS),
                "dataset._component_=torchtune.datasets.preference_dataset",
                "dataset.source=json", f"dataset.data_files={assets}/preference.json",
                "dataset.split=train")
    _recipe_note(data, "lora_dpo_single_device")
    adapters = adapter_shapes(DIMS, rank=8, mlp=True)
    breakdown = data["breakdown"]
    # the reference model is the policy with its adapters off: no second copy of the weights
    assert breakdown["parameter"] == (ex.device_bytes(base_shapes(DIMS), ex.BF16)
                                      + ex.device_bytes(adapters, ex.BF16))
    assert breakdown["optimizer_state"] == fused_adamw_state(adapters)
    # the epoch's end ran: its checkpoint went to the scratch directory, not to output_dir
    assert any("epoch_0/adapter_model" in note for note in data["notes"])
    assert not list((assets / "out").glob("epoch_0/*.safetensors"))
