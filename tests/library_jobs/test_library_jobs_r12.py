"""Round 12: well-known multi-GPU training scripts, re-created from their repositories and run
unmodified through the real CLI under their launchers; each rank's device bytes worked out by
hand (not read from peakmem):

- pytorch/examples distributed/tensor_parallelism/fsdp_tp_example.py (scripts/
  r12_fsdp_tp_example.py) under `torchrun --nproc_per_node 4`: a 2 x 2 ("dp", "tp") mesh, the
  Llama2 model tensor / sequence parallel over "tp", then FSDP1 (`use_orig_params=True`) over
  "dp"; every rank traced (`--ranks all`).

- pytorch/examples distributed/tensor_parallelism/sequence_parallel_example.py (scripts/
  r12_sequence_parallel_example.py) under `torchrun --nproc_per_node 2`: Colwise / Rowwise with
  Shard(0) input and output layouts, the optimizer built after `parallelize_module`.

- pytorch/examples distributed/FSDP/T5_training.py (scripts/r12_fsdp_t5_training.py) under
  `torchrun --nproc_per_node 2`: FSDP1 with `transformer_auto_wrap_policy` over T5Block, the
  bfSixteen MixedPrecision policy, non-reentrant activation checkpointing of every T5Block,
  DistributedSamplers, train + validation, a tiny local T5 checkpoint.

- transformers' examples/pytorch/language-modeling/run_clm.py (scripts/hf_ex_run_clm.py: the
  Trainer) under `torchrun --nproc_per_node 2` with `--fsdp "full_shard auto_wrap"` and an
  `--fsdp_config` naming GPT2Block: accelerate shards each parameter (FSDP2's `fully_shard`).

- torchtitan-style FSDP2 + torch.compile + float8 (scripts/r12_titan_fsdp2_float8.py) under
  `torchrun --nproc_per_node 2`: meta-device init, torchao's `convert_to_float8_training` with
  float8 all-gather, per-block `torch.compile` and `fully_shard` (bf16 params, fp32 reduce),
  fused AdamW; against the same job with `--no-float8`.

- karpathy/nanoGPT train.py under `torchrun --standalone --nproc_per_node=2` (scripts/
  r12_nanogpt_ddp.py): DDP with `require_backward_grad_sync` over accumulation micro-steps and
  rank-0-only sections (`estimate_loss()`, the checkpoint); every rank traced: a rank-0
  evaluation larger than the training step makes rank 0 the largest rank, and the estimate its.

- pytorch/tutorials intermediate_source/pipelining_tutorial.rst (scripts/
  r12_pipelining_tutorial.py) under `torchrun --nproc_per_node 2`: torch.distributed.pipelining
  stages exchange shapes with `dist.recv_object_list`, which a fake process group cannot answer:
  one clear line (exit 3, `unsupported`), neither the job's unpickling error nor an eager rerun.
"""

from __future__ import annotations

import json

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import JobEstimate, estimate, run_script_here
from tests.library_jobs.shared_estimate import shared_estimate
from tests.library_jobs.test_library_jobs import fused_steps

pytestmark = pytest.mark.slow


def _ok(est: JobEstimate) -> JobEstimate:
    assert est.returncode == 0, est.failure()
    assert est.data["estimate_kind"] == "training" and est.data["mode"] == "fake"
    return est


def nccl_communicator_bytes(est: JobEstimate) -> int:
    """The stack profile's assumed NCCL memory per communicator for this estimate's GPU."""
    from peakmem.profiles import load_gpu, load_stack

    stack = load_stack(est.data["torch_version"])
    return int(stack.library_bytes_for(load_gpu(est.data["gpu"]), "nccl").value)


def _rank_rows(est: JobEstimate) -> dict[int, dict]:
    return {row["rank"]: row for row in est.data["ranks"]}


# pytorch/examples distributed/tensor_parallelism/fsdp_tp_example.py: 2-D (FSDP + TP) ----------

WORLD = 2

DIM, HIDDEN, VOCAB, LAYERS, TP, DP = 64, 192, 512, 2, 2, 2
"""r12_fsdp_tp_example.py's ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=512,
multiple_of=64): FeedForward's hidden size is int(2 * 4 * 64 / 3) = 170, rounded up to 192."""


def tp_local_shapes() -> list[ex.Shape]:
    """One TP rank's parameters in `named_parameters` order: embedding Rowwise (rows split), the
    attention and feed-forward projections Colwise / Rowwise (halved), RMSNorms replicated
    (SequenceParallel), output Colwise (rows split)."""
    block = [(DIM // TP, DIM)] * 3 + [(DIM, DIM // TP)]  # wq, wk, wv (rows); wo (columns)
    block += [(HIDDEN // TP, DIM), (DIM, HIDDEN // TP), (HIDDEN // TP, DIM)]  # w1, w2, w3
    block += [(DIM,), (DIM,)]  # attention_norm, ffn_norm
    return [(VOCAB // TP, DIM), *LAYERS * block, (DIM,), (VOCAB // TP, DIM)]


def fsdp_orig_param_parts(shapes: list[ex.Shape], world: int, rank: int) -> list[int]:
    """FSDP1 with use_orig_params over one flat parameter: the numel of each original
    parameter's view inside `rank`'s contiguous shard (no alignment padding: every numel here
    is a multiple of 4 fp32 elements)."""
    sizes = [ex.count([shape]) for shape in shapes]
    shard = -(-sum(sizes) // world)
    begin, end = rank * shard, (rank + 1) * shard
    parts, offset = [], 0
    for size in sizes:
        parts.append(max(0, min(end, offset + size) - max(begin, offset)))
        offset += size
    return parts


@pytest.fixture(scope="module")
def fsdp_tp(tmp_path_factory) -> JobEstimate:
    return shared_estimate(tmp_path_factory, "r12-fsdp-tp", lambda workdir: estimate(
        "r12_fsdp_tp_example.py", "--iterations", "3", cwd=workdir, timeout=200,
        flags=("--ranks", "all"), launcher=("torchrun", "--nproc_per_node", "4")))[0]


def test_fsdp_tp_2d_mesh_shards_twice(fsdp_tp):
    est = _ok(fsdp_tp)
    assert est.data["world_size"] == 4 and est.data["traced_ranks"] == [0, 1, 2, 3]
    local = tp_local_shapes()
    assert ex.count(local) == 86_336  # of the model's 172,352 parameters
    shard = ex.count(local) // DP
    # the flat parameter's shard and its gradient; AdamW's two moments of every original
    # parameter's view into it (zero-sized where the parameter lies in the other dp rank's half)
    assert est.breakdown["parameter"] == ex.rounded(shard * ex.FP32)
    assert est.breakdown["gradient"] == ex.rounded(shard * ex.FP32)
    moments = sum(ex.rounded(n * ex.FP32) for n in fsdp_orig_param_parts(local, DP, 0) if n)
    assert est.breakdown["optimizer_state"] == 2 * moments
    assert "2D iter 1 complete" in est.stderr


def test_fsdp_tp_every_rank_traced_and_the_largest_reported(fsdp_tp):
    est = _ok(fsdp_tp)
    rows = _rank_rows(est)
    assert sorted(rows) == [0, 1, 2, 3]
    # the dp ranks' moments differ in how their views round, not in size: every rank's peak is
    # rank 0's here; the headline is the largest rank's
    assert est.data["peak_bytes"] == max(row["peak_bytes"] for row in rows.values())
    assert rows[est.data["largest_rank"]]["peak_bytes"] == est.data["peak_bytes"]
    local = tp_local_shapes()
    for rank in (0, 1):
        parts = fsdp_orig_param_parts(local, DP, rank)
        assert sum(parts) == ex.count(local) // DP
    # two NCCL communicators on every rank (its "dp" and its "tp" group), each of the stack
    # profile's assumed size
    each = nccl_communicator_bytes(est)
    assert {row["libraries"].get("nccl") for row in rows.values()} == {2 * each}


# pytorch/examples distributed/tensor_parallelism/sequence_parallel_example.py -----------------

def test_sequence_parallel_example_keeps_only_the_shards(tmp_path):
    est = _ok(estimate("r12_sequence_parallel_example.py", cwd=tmp_path, timeout=120,
                       launcher=("torchrun", "--nproc_per_node", "2")))
    assert est.data["world_size"] == 2
    # in_proj Colwise: rows split; out_proj Rowwise: columns split, its bias replicated (the
    # DTensor wraps the moved tensor). The whole weights moved to "cuda" first are freed once
    # replaced (AdamW is built after parallelize_module: it holds the DTensors only)
    shards = ex.device_bytes([(16, 10), (16,), (5, 16), (5,)], ex.FP32)
    assert est.breakdown["parameter"] == shards
    assert est.breakdown["gradient"] == shards
    assert est.breakdown["optimizer_state"] == 2 * shards
    # each rank's 20 input rows all-gathered to 40 before in_proj (Shard(0) -> Replicate)
    assert est.breakdown["activation"] >= ex.rounded(40 * 10 * ex.FP32)
    assert "Sequence Parallel iter 1 completed" in est.stderr


# pytorch/examples distributed/FSDP/T5_training.py: FSDP1 auto-wrap + bf16 + checkpointing -----

def t5_fsdp_units() -> list[list[ex.Shape]]:
    """TINY_T5_CONFIG's parameters by FSDP unit, in registration order: the root (the shared
    embedding, also the tied lm_head, and each stack's final layer norm) and one unit per
    T5Block (each stack's block 0 holds its relative attention bias)."""
    from tests.library_jobs.test_library_jobs_hf import t5_shapes

    shapes = t5_shapes()
    encoder_block, decoder_block = 5 + 3, 5 + 5 + 3  # self-attention (+ cross) + feed-forward
    units, at = [], 1
    for block in (encoder_block, decoder_block):
        first = shapes[at:at + 1 + block]  # the relative attention bias + block 0
        second = shapes[at + 1 + block:at + 1 + 2 * block]
        units += [first, second]
        at += 1 + 2 * block + 1  # + the stack's final layer norm
    root = [shapes[0], shapes[1 + 2 * encoder_block + 1], shapes[-1]]
    assert at == len(shapes) and sum(map(len, units)) + len(root) == len(shapes)
    return [root, *units]


@pytest.fixture(scope="module")
def fsdp_t5(tmp_path_factory) -> JobEstimate:
    pytest.importorskip("transformers")
    from tests.library_jobs.test_library_jobs_hf import TINY_T5_CONFIG

    def run(workdir):
        run_script_here("make_t5_checkpoint.py", str(workdir / "t5"), json.dumps(TINY_T5_CONFIG))
        return estimate("r12_fsdp_t5_training.py", "--model_name_or_path", str(workdir / "t5"),
                        "--input-length", "64", "--output-length", "16", "--train-samples", "32",
                        "--val-samples", "16", "--epochs", "1", "--no-decoder-cache", cwd=workdir,
                        timeout=240, launcher=("torchrun", "--nproc_per_node", "2"))

    return shared_estimate(tmp_path_factory, "r12-fsdp-t5", run)[0]


def test_fsdp_t5_auto_wrap_shards_each_unit_flat(fsdp_t5):
    est = _ok(fsdp_t5)
    assert est.data["world_size"] == 2 and est.data["phases_ran"][:2] == ["training", "eval"]
    assert "bf16_ready True" in est.stderr and "Validation Loss" in est.stderr
    # use_orig_params=False: each unit's parameters end to end in one fp32 flat parameter, padded
    # to an even length and halved; AdamW holds the flat parameters, two moments of each shard
    shards = [-(-ex.count(unit) // WORLD) for unit in t5_fsdp_units()]
    assert len(shards) == 5
    params = sum(ex.rounded(shard * ex.FP32) for shard in shards)
    assert est.breakdown["parameter"] == params
    assert est.breakdown["optimizer_state"] == 2 * params
    # bfSixteen: a unit runs on its whole bf16 parameter (all-gathered); the largest one and
    # the fp32 state are live together in the forward
    largest = max(ex.count(unit) for unit in t5_fsdp_units())
    assert est.data["peak_allocated_bytes"] >= 3 * params + ex.rounded(largest * ex.BF16)


# transformers run_clm.py (Trainer) under torchrun with --fsdp ---------------------------------

@pytest.fixture(scope="module")
def trainer_fsdp(tmp_path_factory) -> JobEstimate:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")
    from tests.library_jobs import test_library_jobs_hf2 as hf2

    def run(workdir):
        files = hf2.write_clm_files(workdir)
        config = workdir / "fsdp_config.json"
        config.write_text(json.dumps({"transformer_layer_cls_to_wrap": ["GPT2Block"]}))
        return estimate(
            "hf_ex_run_clm.py", "--config_name", str(files["model"]),
            "--tokenizer_name", str(files["model"]), "--train_file", str(files["train"]),
            "--validation_file", str(files["valid"]), "--block_size", str(hf2.BLOCK_SIZE),
            "--per_device_train_batch_size", str(hf2.BATCH), "--per_device_eval_batch_size",
            str(hf2.BATCH), "--max_steps", "3", "--do_train", "--do_eval", "--report_to", "none",
            "--seed", "0", "--output_dir", str(files["out"]), "--fsdp", "full_shard auto_wrap",
            "--fsdp_config", str(config), cwd=workdir, timeout=300,
            launcher=("torchrun", "--nproc_per_node", "2"))

    return shared_estimate(tmp_path_factory, "r12-trainer-fsdp", run)[0]


def test_trainer_fsdp_full_shard_under_torchrun_shards_every_parameter(trainer_fsdp):
    est = _ok(trainer_fsdp)
    assert est.data["world_size"] == 2 and est.data["steps"] == 3
    assert est.data["phases_ran"][-1] == "eval"
    # fully_shard: each parameter's own padded shard of ceil(dim 0 / 2) rows (one allocation
    # each); the Trainer's fused AdamW: two moments of each shard and a 0-d device step
    shapes = ex.gpt2_shapes(**ex.TINY_GPT2)  # the tokenizer's 126 ids fit: no resize
    params = sum(ex.rounded(-(-shape[0] // WORLD) * ex.count([shape[1:]]) * ex.FP32)
                 for shape in shapes)
    assert params < ex.device_bytes(shapes, ex.FP32) // WORLD + len(shapes) * ex.BLOCK
    assert est.breakdown["parameter"] == params
    assert est.breakdown["optimizer_state"] == 2 * params + fused_steps(shapes)
    notes = "\n".join(est.data["notes"])
    assert "pytorch_model_fsdp.bin" in notes  # the checkpoint's full state dict (diverted)


# torchtitan-style FSDP2 + compile + float8 ------------------------------------------------------

TITAN_DIM, TITAN_HIDDEN, TITAN_VOCAB, TITAN_LAYERS = 128, 256, 512, 2


def titan_shapes() -> list[ex.Shape]:
    block = [(TITAN_DIM, TITAN_DIM)] * 4  # wq, wk, wv, wo
    block += [(TITAN_HIDDEN, TITAN_DIM), (TITAN_DIM, TITAN_HIDDEN), (TITAN_HIDDEN, TITAN_DIM)]
    block += [(TITAN_DIM,), (TITAN_DIM,)]  # the two RMSNorms
    return [(TITAN_VOCAB, TITAN_DIM), *TITAN_LAYERS * block, (TITAN_DIM,), (TITAN_VOCAB, TITAN_DIM)]


@pytest.fixture(scope="module")
def titan(tmp_path_factory) -> dict[str, JobEstimate]:
    pytest.importorskip("torchao")

    def run(*flags: str):
        return lambda workdir: estimate(
            "r12_titan_fsdp2_float8.py", "--steps", "4", *flags, cwd=workdir, timeout=200,
            launcher=("torchrun", "--nproc_per_node", "2"))

    return {name: shared_estimate(tmp_path_factory, f"r12-titan-{name}", run(*flags))[0]
            for name, flags in (("float8", ()), ("bf16", ("--no-float8",)))}


def test_titan_fsdp2_float8_shards_fp32_state(titan):
    for est in map(_ok, titan.values()):
        assert est.data["world_size"] == 2 and est.data["steps"] == 3
        shapes = titan_shapes()
        params = sum(ex.rounded(-(-shape[0] // WORLD) * ex.count([shape[1:]]) * ex.FP32)
                     for shape in shapes)
        assert est.breakdown["parameter"] == params
        assert est.breakdown["optimizer_state"] == 2 * params + fused_steps(shapes)
        assert "torch.compile" in "\n".join(est.data["notes"])


def test_titan_float8_all_gather_gathers_one_byte_weights(titan):
    float8, bf16 = _ok(titan["float8"]), _ok(titan["bf16"])
    # with enable_fsdp_float8_all_gather a block's Linear weights are all-gathered as float8
    # (1 byte) instead of bf16 (2 bytes): the activations at the peak, which hold one block's
    # unsharded Linear weights, differ by one byte per weight element of a block
    block_weights = 4 * TITAN_DIM * TITAN_DIM + 3 * TITAN_HIDDEN * TITAN_DIM
    assert bf16.breakdown["activation"] - float8.breakdown["activation"] == block_weights
    assert float8.data["peak_allocated_bytes"] < bf16.data["peak_allocated_bytes"]


# karpathy/nanoGPT train.py under torchrun: rank-0-only evaluation and checkpoint --------------

NANOGPT = dict(vocab=512, positions=32, embd=64, layers=2)
"""r12_nanogpt_ddp.py's defaults (r8_nanogpt_resume.py's: block_size 32, tied wte / lm_head)."""
EVAL_ROWS, BLOCK_SIZE = 256, 32


def test_nanogpt_ddp_rank0_evaluation_makes_rank0_the_largest(tmp_path):
    from tests.library_jobs.test_library_jobs_r8 import _nanogpt_data

    _nanogpt_data(tmp_path)
    est = _ok(estimate("r12_nanogpt_ddp.py", "--max_iters=4", "--eval_interval=2",
                       f"--eval_batch_size={EVAL_ROWS}", cwd=tmp_path, timeout=200,
                       flags=("--ranks", "all"),
                       launcher=("torchrun", "--standalone", "--nproc_per_node=2")))
    assert est.data["world_size"] == 2 and est.data["traced_ranks"] == [0, 1]
    rows = _rank_rows(est)
    # only rank 0 (master_process) runs estimate_loss() on 256-row batches and saves ckpt.pt:
    # its peak is set there, above rank 1's training-only peak; the headline (and `fits`) is
    # rank 0's
    assert rows[0]["peak_allocated_bytes"] > rows[1]["peak_allocated_bytes"]
    assert est.data["largest_rank"] == 0 and est.data["peak_bytes"] == rows[0]["peak_bytes"]
    assert est.data["fits"] == rows[0]["fits"]
    notes = "\n".join(est.data["notes"])
    assert "the peak was set by the evaluation" in notes and "out/ckpt.pt" in notes
    # DDP keeps whole replicas: the fp32 weights and fused AdamW's state (two moments and a
    # device step per parameter); rank 0's evaluation logits (bf16 autocast) on top
    shapes = ex.gpt2_shapes(**NANOGPT)
    params = ex.device_bytes(shapes, ex.FP32)
    assert est.breakdown["parameter"] == params
    assert est.breakdown["optimizer_state"] == 2 * params + fused_steps(shapes)
    logits = EVAL_ROWS * BLOCK_SIZE * NANOGPT["vocab"] * ex.BF16
    assert rows[0]["peak_allocated_bytes"] >= 3 * params + logits
    assert "saving checkpoint to out" in est.stderr  # rank 0's output


# pytorch/tutorials pipelining_tutorial.rst: torch.distributed.pipelining --------------------

def test_pipelining_tutorial_is_refused_in_one_line(tmp_path):
    est = estimate("r12_pipelining_tutorial.py", "--schedule", "1f1b", cwd=tmp_path,
                   timeout=120, launcher=("torchrun", "--nproc_per_node", "2"))
    assert est.returncode == 3, est.failure()
    error = est.data["error"]
    assert error["kind"] == "unsupported" and "\n" not in error["message"]
    assert error["message"].startswith("rank 0: peakmem does not support pipeline parallelism")
    assert "torch.distributed.pipelining" in error["message"]
    assert "host RAM" not in error["message"]  # no eager rerun (it would wait the same way)
