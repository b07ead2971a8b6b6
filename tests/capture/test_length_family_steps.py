"""Growing-length families (capture.length_family) where a size steps with the length: a
CUDA rule's decision with a threshold (cuda_rules/size_checks.py) is asked again at a predicted
call, and a length is predicted only in a cell (length_family.CELL) where a call ran for real,
so the replayed run equals the op-by-op one to the byte and no replay is left in doubt. Also:
random ops on fake device tensors (dropout in train mode) are replayed, since they draw from no
generator the job can see."""

import torch
from torch import nn
from torch.nn import functional as F

from peakmem.capture.length_family import CELL, Family, cell
from peakmem.capture.repeated_forwards import ENV_FLAG
from peakmem.cuda_rules import size_checks
from peakmem.cuda_rules.sdpa import bias_padding
from peakmem.estimate import estimate
from tests.capture.test_repeated_forwards import GPU, REPLAYED, TinyGPT, assert_same, run

IN_DOUBT = "before a check that found the fit wrong"


def test_bias_padding_steps_past_each_multiple_of_16():
    # memory-efficient attention pads a bias's last dimension to a multiple of 16 (attention.cu
    # `preprocess_mask`); a multiple is not padded at all
    assert bias_padding(120) == (True, 128)
    assert bias_padding(127) == (True, 128)
    assert bias_padding(128) == (False, 128)
    assert bias_padding(129) == (True, 144)


def test_cells_separate_every_multiple_of_the_cell():
    assert CELL == 8
    assert cell(121) == cell(127) != cell(128)
    assert cell(128) not in (cell(127), cell(129))
    assert cell(129) == cell(135) != cell(136)


class MaskedAttention(nn.Module):
    """SDPA with an additive float mask made in the call: on an A100 the memory-efficient
    backend (flash takes no mask), whose bias is padded to (L, ceil(L / 16) * 16) floats: over
    lengths 120..123 an affine size (L x 128), none at 128, then L x 144 from 129."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(65, 16)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.emb(idx).view(1, 1, t, 16)
        mask = torch.zeros(t, t, device=idx.device)
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def masked_job():
    model = MaskedAttention().cuda().eval()
    idx = torch.zeros((1, 120), dtype=torch.long, device="cuda")
    with torch.no_grad():
        for _ in range(21):  # lengths 120 .. 140
            model(idx)
            idx = torch.cat((idx, idx[:, :1]), dim=1)


def test_a_padded_bias_stepping_at_129_is_replayed_exactly(monkeypatch):
    full, _ = run(monkeypatch, masked_job, replay=False, steps="all")
    sizes = full["trace"][2]
    # the op-by-op run pads the (L, L) fp32 bias to 128 columns, then to 144 from 129
    assert 4 * 127 * 128 in sizes and 4 * 129 * 144 in sizes and 4 * 128 * 144 not in sizes
    with monkeypatch.context() as patch:
        patch.setenv(ENV_FLAG, "1")
        result = estimate(masked_job, steps="all", **GPU)
    note = next(n for n in result.to_json()["notes"] if REPLAYED in n)
    assert IN_DOUBT not in note
    fast, replayed = run(monkeypatch, masked_job, replay=True, steps="all")
    assert fast == full
    # 121 .. 124 observed (the first call is no template: the phase moves), 125 .. 127
    # predicted in 121's cell; 128 (a cell of its own; the bias's padding answers otherwise)
    # and 129 (a new cell, other events) run, 129 .. 132 observed again, 133 .. 135 predicted;
    # 136 (its own cell) and 137 (a new cell) run and are predicted, 138 .. 140 predicted
    assert replayed == 3 + 3 + 3


def test_without_the_guards_the_step_is_missed(monkeypatch):
    # the same job with the size checks and the cells switched off: the fit from 121 .. 124
    # carries the padded bias on through 128 (unpadded there) and at L x 128 past 129
    full, _ = run(monkeypatch, masked_job, replay=False, steps="all")
    monkeypatch.setattr(size_checks, "hold", lambda checks: True)
    monkeypatch.setattr(Family, "predicts_here", lambda self, inputs: self.fit is not None)
    fast, replayed = run(monkeypatch, masked_job, replay=True, steps="all")
    assert replayed > 9
    assert fast["trace"][2] != full["trace"][2]


def test_a_fit_is_not_used_outside_the_cells_it_ran_in():
    family = Family(None, None)
    for length in (120, 121, 122, 123):  # numbers affine in the length
        assert family.observe([1, length], [4 * length, 7]) == 0
    assert family.fit is not None
    assert family.predicts_here([1, 126]) and family.predict([1, 126]) == [504, 7]
    assert family.predicts_here([1, 120]) and not family.predicts_here([1, 128])
    assert not family.predicts_here([1, 129])
    # 128 runs for real and is predicted: its cell is trusted from now on, 129's is not
    assert family.observe([1, 128], [512, 7]) == 0
    assert family.predicts_here([1, 128]) and not family.predicts_here([1, 129])


def test_a_mismatch_explained_by_a_size_check_leaves_nothing_in_doubt():
    family = Family(None, None)
    for length in (120, 121, 122, 123):
        family.observe([1, length], [4 * length])
    family.unchecked = 4  # 124 .. 127 replayed
    assert family.observe([1, 128], [0], explained=True) == 0
    assert family.fit is None
    family = Family(None, None)
    for length in (120, 121, 122, 123):
        family.observe([1, length], [4 * length])
    family.unchecked = 4
    assert family.observe([1, 128], [0]) == 4


def train_mode_job(generator=False, host_draw=False):
    """Evaluation under no_grad with the model left in train mode: dropout is active."""

    class Drawing(TinyGPT):
        def forward(self, idx, targets=None):
            if host_draw:
                torch.rand(3)  # a host random draw: the job's stream moves
            if generator:
                noise = torch.empty(idx.shape, device=idx.device)
                noise.uniform_(generator=torch.Generator(device="cuda"))
            return super().forward(idx, targets)

    def job():
        model = Drawing().cuda()
        idx = torch.zeros((2, 16), dtype=torch.long, device="cuda")
        with torch.no_grad():
            for _ in range(10):
                logits, _ = model(idx)
                del logits
        torch.randint(0, 10, (1,))  # after the loop: the host stream as the op-by-op run left it

    return job


def test_dropout_in_train_mode_under_no_grad_is_replayed(monkeypatch):
    # dropout on a fake device tensor draws from no generator (the meta kernel allocates only):
    # after 3 identical calls (the first after none is a template) the rest are replayed
    assert assert_same(monkeypatch, train_mode_job(), steps="all") == 10 - 3 - 1


def test_forwards_drawing_host_or_own_generator_numbers_run_for_real(monkeypatch):
    assert assert_same(monkeypatch, train_mode_job(host_draw=True), steps="all") == 0
    assert assert_same(monkeypatch, train_mode_job(generator=True), steps="all") == 0
