"""Round 11: training scripts from well-known repositories not covered before, each re-created
in a tiny script the way the public source it cites writes it and run unmodified
(scripts/r11_*.py). Parameter, gradient and optimizer bytes are worked out by hand
(expected.py), not read from peakmem. Jobs that need torch alone run in this process
(`estimate_here`): the child-process path is covered by the earlier rounds' tests."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate_here
from tests.library_jobs.test_library_jobs import assert_training

KNOWN_VALUES = importlib.util.find_spec("peakmem.capture.known_values") is not None
"""Whether fake mode carries small known host values through device ops (`labels.max()` of
labels copied from the host): branch k1 re-lands it (capture/known_values.py)."""


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


# pytorch/examples gat/main.py: dense multi-head graph attention on Cora ---------------------------

GAT_NODES, GAT_FEATURES, GAT_CLASSES, GAT_EDGES = 1700, 24, 7, 3000
"""The synthetic Cora: more than 1600 nodes (the script's split is idx[:1200], idx[1200:1600],
idx[1600:]), binary word features, seven classes named like Cora's."""


def write_cora(root: Path) -> None:
    """./cora/cora.content (`<paper id> <features...> <class>`) and ./cora/cora.cites (`<cited>
    <citing>`), the tab- and space-separated files of linqs' cora.tgz, in `root`: with both
    present the script downloads nothing."""
    rng = random.Random(0)
    cora = root / "cora"
    cora.mkdir()
    ids = rng.sample(range(10, 10**6), GAT_NODES)
    rows = [" ".join([str(paper)] + [str(rng.randint(0, 1)) for _ in range(GAT_FEATURES)]
                     + [f"Class_{index % GAT_CLASSES}"]) for index, paper in enumerate(ids)]
    (cora / "cora.content").write_text("\n".join(rows) + "\n")
    cites = [f"{rng.choice(ids)}\t{rng.choice(ids)}" for _ in range(GAT_EDGES)]
    (cora / "cora.cites").write_text("\n".join(cites) + "\n")


def gat_shapes(features: int, hidden: int, heads: int, classes: int) -> list[ex.Shape]:
    """GAT: two GraphAttentionLayers (heads averaged: n_hidden = out_features), each a bare
    W (in, n_hidden * heads) and a (heads, 2 * n_hidden, 1); the second has one head."""
    return [(features, hidden * heads), (heads, 2 * hidden, 1), (hidden, classes), (1, 2 * classes, 1)]


@pytest.mark.xfail(not KNOWN_VALUES, strict=True,
                   reason="`num_classes=labels.max().item() + 1` reads 0 without known values: "
                          "fake mode builds a 1-class head (capture/known_values.py, branch k1)")
def test_gat_dense_attention_over_all_node_pairs(tmp_path):
    hidden, heads, epochs = 64, 8, 3
    write_cora(tmp_path)
    params = ex.device_bytes(gat_shapes(GAT_FEATURES, hidden, heads, GAT_CLASSES), ex.FP32)
    est = estimate_here("r11_examples_gat.py", "--epochs", str(epochs), "--val-every", "1",
                        "--hidden-dim", str(hidden), "--num-heads", str(heads), cwd=tmp_path)
    scores = heads * GAT_NODES**2 * ex.FP32  # one (heads, V, V) fp32 attention tensor
    # the first layer keeps for backward its scores (LeakyReLU's input), the softmax output,
    # the dropout mask (bool) and the dropped attention (matmul's input): 13 bytes a score
    assert_training(est, params=params, optimizer_state=2 * params,  # Adam, weight decay
                    extra_lower=3 * scores + scores // 4, extra_upper=8 * scores)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.breakdown["activation"] >= 3 * scores + scores // 4, est.breakdown
    # the adjacency: `torch.eye(V) + sparse COO` is a dense (V, V) fp32 matrix moved to the device
    assert est.breakdown["input"] >= ex.rounded(GAT_NODES**2 * ex.FP32), est.breakdown
    # each step is followed by test() on the train and validation masks, under no_grad
    assert est.data["phases_ran"] == ["training", "eval"] * (epochs - 1) + ["training"]
    assert est.data["steps"] == epochs and "does not iterate a DataLoader" in _notes(est)
    assert "Dataset already downloaded..." in est.stderr


# transformers examples/pytorch/language-modeling/run_plm.py: XLNet permutation LM, Trainer -------

XLNET = dict(vocab=256, d_model=64, layers=2, heads=4, d_inner=128)
"""`--config_overrides` on the script's `XLNetConfig()` (whose defaults are XLNet-large's).
`update_from_string` sets only the keys given: d_head must be given too (d_model // n_head), or
the checkpoint's `config.save_pretrained` fails its validation, on a GPU as here."""
PLM_SEQ, PLM_BATCH = 32, 4


def xlnet_lm_shapes(vocab: int, d_model: int, layers: int, heads: int, d_inner: int
                    ) -> tuple[list[ex.Shape], list[ex.Shape]]:
    """XLNetLMHeadModel: (all parameters, those no gradient reaches). The word embedding and
    mask_emb (1, 1, d); per layer the relative attention's q / k / v / o / r projections
    (d, heads, d_head) each, its r_r / r_s / r_w biases (heads, d_head) and seg_embed
    (2, heads, d_head), its LayerNorm, the feed-forward LayerNorm, layer_1 and layer_2; lm_loss
    is tied to the word embedding (only its bias is a tensor of its own). Without
    token_type_ids, seg_embed and r_s_bias take no part in the loss: no gradient, so no
    AdamW state either."""
    d_head = d_model // heads
    shapes: list[ex.Shape] = [(vocab, d_model), (1, 1, d_model)]
    unused: list[ex.Shape] = []
    for _ in range(layers):
        shapes += 5 * [(d_model, heads, d_head)] + 3 * [(heads, d_head)] + [(2, heads, d_head)]
        shapes += ex.norm(d_model) + ex.norm(d_model) + ex.linear(d_inner, d_model) + ex.linear(d_model, d_inner)
        unused += [(heads, d_head), (2, heads, d_head)]  # r_s_bias, seg_embed
    return shapes + [(vocab,)], unused


def test_run_plm_xlnet_permutation_masks_with_the_trainer(tmp_path):
    pytest.importorskip("datasets")
    from tests.library_jobs.test_library_jobs_hf import sentences, write_tokenizer

    tokenizer = write_tokenizer(tmp_path / "tokenizer")  # 126 words: no resize of the 256 rows
    (tmp_path / "train.txt").write_text("\n".join(sentences(200)) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(sentences(20, seed=1)) + "\n")
    overrides = ("d_model={d_model},n_layer={layers},n_head={heads},d_head={d_head},"
                 "d_inner={d_inner},vocab_size={vocab}")
    est = estimate_here(
        "r11_hf_ex_run_plm.py", "--config_overrides", overrides.format(**XLNET, d_head=XLNET["d_model"] // XLNET["heads"]),
        "--tokenizer_name", str(tokenizer), "--train_file", "train.txt",
        "--validation_file", "valid.txt", "--max_seq_length", str(PLM_SEQ),
        "--per_device_train_batch_size", str(PLM_BATCH), "--per_device_eval_batch_size", str(PLM_BATCH),
        "--max_steps", "3", "--do_train", "--do_eval", "--report_to", "none", "--seed", "0",
        "--output_dir", "out", cwd=tmp_path)
    shapes, unused = xlnet_lm_shapes(**XLNET)
    params = ex.device_bytes(shapes, ex.FP32)
    trained = params - ex.device_bytes(unused, ex.FP32)
    # the Trainer's fused AdamW: two moments and a device `step` (0-d fp32, one block) for each
    # parameter that got a gradient; none for seg_embed / r_s_bias
    state = 2 * trained + ex.BLOCK * (len(shapes) - len(unused))
    assert_training(est, params=params, grads=trained, optimizer_state=state)
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["phases_ran"] == ["training", "eval"]
    # the collator's batch: input_ids and labels (batch, seq) int64, perm_mask and
    # target_mapping (batch, seq, seq) fp32
    batch = 2 * ex.rounded(PLM_BATCH * PLM_SEQ * 8) + 2 * ex.rounded(PLM_BATCH * PLM_SEQ**2 * ex.FP32)
    assert est.breakdown["input"] >= batch, est.breakdown
    assert "perplexity" in est.stderr and (tmp_path / "out" / "eval_results.json").is_file()
