"""Fine-tuning libraries under the capture, with the real packages: bitsandbytes (8-bit and
paged optimizers, 4-bit QLoRA layers), PEFT QLoRA from a local checkpoint."""

import importlib.util
import textwrap

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.bitsandbytes_model import PAGED_NOTE
from peakmem.estimate import estimate_command
from tests.capture.capture_helpers import allocations, live_at_end

bnb = pytest.importorskip("bitsandbytes")

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}
N = 1024
BLOCK = 256  # bitsandbytes' blockwise 8-bit optimizers: one fp32 absmax per 256 values
QMAP = 256 * 4  # a 256-entry fp32 code table per 8-bit state


def write(tmp_path, body, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def state_bytes(result) -> int:
    return sum(size for size, _tag in allocations(result.trace, "optimizer_state"))


def train_with(optimizer_name):
    def job():
        model = torch.nn.Linear(N, N, bias=False).cuda()
        optimizer = getattr(bnb.optim, optimizer_name)(model.parameters())
        for _ in range(2):
            model(torch.randn(8, N, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    return job


@pytest.mark.parametrize(
    ("name", "states"),
    [("AdamW8bit", 2), ("Adam8bit", 2), ("Lion8bit", 1), ("PagedAdamW8bit", 2), ("PagedLion8bit", 1)],
)
def test_8bit_optimizer_states_are_counted_at_their_real_size(a100, stack24, name, states):
    result = capture_callable(train_with(name), gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    expected = states * (N * N + (N * N // BLOCK) * 4)  # uint8 state + fp32 absmax per block
    assert expected <= state_bytes(result) <= expected + states * QMAP
    assert result.steps == 2
    assert (PAGED_NOTE in result.notes) == name.startswith("Paged")


def test_a_paged_32bit_optimizer_keeps_fp32_state_on_the_device(a100, stack24):
    result = capture_callable(train_with("PagedAdamW"), gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert state_bytes(result) == 2 * N * N * 4
    assert PAGED_NOTE in result.notes


def test_linear4bit_weights_are_packed_nf4(a100, stack24):
    kept = []

    def job():
        layer = bnb.nn.Linear4bit(N, N, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
        kept.append(layer.cuda())
        x = torch.randn(4, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        kept[0](x).float().sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    live = live_at_end(result.trace)
    assert N * N // 2 in live  # the packed 4-bit weight
    # bitsandbytes moves the fp32 weight to the device and quantizes it there: that copy is
    # made, then freed
    assert N * N * 4 in [size for size, _tag in allocations(result.trace)]
    assert N * N * 4 not in live
    weight = kept[0].weight
    assert weight.dtype == torch.uint8 and weight.numel() == N * N // 2


IMPORT_UNDER_CAPTURE = """
    import torch
    import bitsandbytes as bnb

    model = torch.nn.Linear(1024, 1024, bias=False).cuda()
    optimizer = bnb.optim.AdamW8bit(model.parameters())
    for _ in range(3):
        model(torch.randn(8, 1024, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_bitsandbytes_imports_its_cuda_backend_under_the_fake_runtime(tmp_path):
    result = estimate_command(["python", write(tmp_path, IMPORT_UNDER_CAPTURE)], **GPU)
    assert result.steps == 3
    state = result.breakdown.by_category["optimizer_state"]
    assert 2 * N * N <= state <= 2 * N * N + 64 * 1024
    assert not any(note.startswith("torch.compile was not applied") for note in result.notes)


QLORA = """
    import sys
    import torch
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True)
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], quantization_config=quant, device_map={"": 0})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    base = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    assert type(base).__name__ == "Linear4bit", type(base)
    optimizer = bnb.optim.PagedAdamW8bit([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    for step in range(3):
        ids = torch.randint(0, 320, (2, 32), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    for package in ("transformers", "peft"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")
    from peakmem.capture.vision_ops import declare_torchvision_ops

    declare_torchvision_ops()  # transformers imports torchvision (README)
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = dict(vocab_size=320, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**tiny)).save_pretrained(str(folder), safe_serialization=True)
    return str(folder)


def test_a_qlora_recipe_from_a_local_checkpoint(tmp_path, tiny_llama):
    result = estimate_command(["python", write(tmp_path, QLORA), tiny_llama], **GPU)
    assert result.steps == 3 and result.estimate_kind == "training"
    by = result.breakdown.by_category
    # the 4-bit base weights: far below the fp32 model's 0.53 MB of parameters
    assert by["parameter"] < 300_000
    assert by["optimizer_state"] > 0  # the adapters' state
    assert PAGED_NOTE not in result.notes  # bitsandbytes pages only states over 1e5 values


def test_torchtunes_bf16_check_passes_under_the_fake_runtime(a100, stack24):
    """torchtune's `verify_bf16_support()`: CUDA available, bf16 supported, NCCL available and
    at least 2.10 (the same expression, so the test runs without importing torchtune)."""
    seen = {}
    import types

    # the expression as torchtune.training.precision writes it, run as torchtune's code
    probe = types.ModuleType("torchtune.training.precision")
    exec(
        "import torch\n"
        "def verify_bf16_support():\n"
        "    return (torch.cuda.is_available() and torch.cuda.is_bf16_supported()\n"
        "            and torch.distributed.is_nccl_available()\n"
        "            and torch.cuda.nccl.version() >= (2, 10))\n",
        probe.__dict__,
    )

    def job():
        seen["bf16"] = probe.verify_bf16_support()
        seen["job_nccl"] = torch.distributed.is_nccl_available()  # the job's own question
        torch.cuda.memory._record_memory_history(max_entries=1000)  # a no-op here
        torch.zeros(4, device="cuda")
        torch.cuda.memory._record_memory_history(enabled=None)

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert seen["bf16"] is True
    assert seen["job_nccl"] is True  # as on a CUDA build: "nccl" gets the fake process group
    assert not torch.distributed.is_nccl_available()  # restored after the capture


TORCHTUNE_LORA = """
    import torch
    from torchtune.models.llama3_2 import lora_llama3_2
    from torchtune.modules.peft import get_adapter_params, set_trainable_params
    from torchtune.training.precision import get_dtype, verify_bf16_support

    assert verify_bf16_support()
    torch.set_default_dtype(get_dtype("bf16", device=torch.device("cuda")))
    with torch.device("cuda"):
        model = lora_llama3_2(lora_attn_modules=["q_proj", "v_proj"], vocab_size=512, num_layers=2,
                              num_heads=4, num_kv_heads=2, embed_dim=64, max_seq_len=2048,
                              intermediate_dim=128, lora_rank=8, lora_alpha=16)
    torch.set_default_dtype(torch.float32)
    rope = model.layers[0].attn.pos_embeddings
    assert rope.is_cache_built, "the Llama 3 RoPE cache was skipped"
    set_trainable_params(model, get_adapter_params(model))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    for _ in range(3):
        tokens = torch.randint(0, 512, (2, 64), device="cuda")
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_torchtune_lora_llama3_model_trains_with_its_rope_cache(tmp_path, monkeypatch):
    from tests.capture.torchtune_env import torchtune_pythonpath, with_torchtune_path
    with_torchtune_path(monkeypatch, torchtune_pythonpath())
    result = estimate_command(["python", write(tmp_path, TORCHTUNE_LORA)], **GPU)
    assert result.steps == 3
    # the RoPE cache: 2048 positions x 8 frequencies x (cos, sin), fp32... in bf16 default dtype
    assert result.breakdown.by_category.get("buffer", 0) > 0


IGEMM = """
    import torch
    import bitsandbytes as bnb

    a = torch.randint(-5, 5, (16, 32), dtype=torch.int8, device="cuda")
    b = torch.randint(-5, 5, (32, 8), dtype=torch.int8, device="cuda")
    bnb.functional.igemm(a, b)
"""


def test_a_native_bitsandbytes_kernel_called_directly_is_unsupported(tmp_path):
    from click.testing import CliRunner

    from peakmem.cli.main import main

    run = CliRunner().invoke(main, ["estimate", "--json", "--", "python", write(tmp_path, IGEMM)])
    assert run.exit_code == 3, run.output
    assert '"kind": "unsupported"' in run.output
    assert "peakmem does not support bitsandbytes' native CUDA function" in run.output


HF_TRAINER_OPTIM = """
    import sys, tempfile, torch
    from transformers import Trainer, TrainingArguments

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return {"x": torch.randn(256)}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 4))
        def forward(self, x):
            return {"loss": self.net(x).square().mean()}

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=3, per_device_train_batch_size=4,
            optim=sys.argv[1], report_to=[], save_strategy="no", dataloader_num_workers=0,
            remove_unused_columns=False)
        Trainer(model=Net(), args=args, train_dataset=Rows()).train()
"""


@pytest.mark.parametrize(
    ("optim", "bytes_per_value"),
    [("adamw_bnb_8bit", 2), ("adamw_torch_4bit", 1)],
)
def test_hf_trainer_low_bit_optimizers(tmp_path, optim, bytes_per_value):
    pytest.importorskip("torchao")
    from tests.capture.test_accumulation import _reset_accelerate

    try:
        result = estimate_command(["python", write(tmp_path, HF_TRAINER_OPTIM), optim], isolate=False, **GPU)
    finally:
        _reset_accelerate()
    assert result.steps == 3
    big = 256 * 1024 + 1024 * 4  # the two weights: the quantised ones (the biases stay 32-bit)
    state = result.breakdown.by_category["optimizer_state"]
    assert bytes_per_value * big <= state <= bytes_per_value * big * 1.15 + 64 * 1024, state
