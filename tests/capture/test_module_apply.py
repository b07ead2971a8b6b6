"""Moving modules between the host and the fake device keeps every Parameter object, as CUDA
does (capture/module_apply.py): tied weights stay tied, optimizers built before the move see the
moved parameters, gradients move with them."""

import pytest
import torch
from torch import nn

from peakmem.capture import capture_callable
from peakmem.capture.device_view import JOB_DEVICE
from peakmem.estimate import estimate
from peakmem.estimate.breakdown import rounded
from tests.capture.capture_helpers import allocations

VOCAB, EMBED, BLOCK, LAYERS = 512, 64, 16, 2


class TinyGPT(nn.Module):
    """nanoGPT's structure: token + position embeddings, blocks, a head tied to the embedding."""

    def __init__(self, tie: bool = True):
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(VOCAB, EMBED),
                "wpe": nn.Embedding(BLOCK, EMBED),
                "h": nn.ModuleList(
                    nn.TransformerEncoderLayer(EMBED, 2, 4 * EMBED, dropout=0.0, batch_first=True)
                    for _ in range(LAYERS)
                ),
                "ln_f": nn.LayerNorm(EMBED),
            }
        )
        self.lm_head = nn.Linear(EMBED, VOCAB, bias=False)
        if tie:
            self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def _untied_numel() -> int:
    return sum(p.numel() for p in TinyGPT(tie=False).parameters())


def _run(job, gpu, stack, **kwargs):
    result = capture_callable(job, gpu=gpu, stack=stack, **kwargs)
    assert result.error is None, result.error_text
    return result


MOVES = {
    "to_cuda": lambda m: m.to("cuda"),
    "cuda": lambda m: m.cuda(),
    "to_0": lambda m: m.to(0),
    "to_device": lambda m: m.to(torch.device("cuda", 0)),
    "to_cuda_half": lambda m: m.to("cuda", torch.float16),
    "cuda_then_half": lambda m: m.cuda().half(),
    "twice": lambda m: m.to("cuda").to("cuda"),
    "cuda_cpu_cuda": lambda m: m.cuda().cpu().cuda(),
}


@pytest.mark.parametrize("move", sorted(MOVES))
def test_tied_weights_stay_one_parameter(a100, stack24, move):
    seen = {}

    def job():
        model = TinyGPT()
        weight = model.lm_head.weight
        MOVES[move](model)
        seen["tied"] = model.transformer.wte.weight is model.lm_head.weight
        seen["same_object"] = model.lm_head.weight is weight
        seen["device"] = weight.device
        seen["numel"] = sum(p.numel() for p in model.parameters())

    _run(job, a100, stack24)
    assert seen["tied"] and seen["same_object"]
    assert seen["device"] == JOB_DEVICE
    assert seen["numel"] == _untied_numel() - VOCAB * EMBED


def train_gpt(steps: int = 3) -> None:
    model = TinyGPT().to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        idx = torch.randint(0, VOCAB, (4, BLOCK), device="cuda")
        logits = model(idx)
        loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), idx.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_estimate_counts_a_tied_weight_once():
    result = estimate(train_gpt, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    # the breakdown rounds each allocation as the caching allocator does (512 B)
    tied = sum(rounded(p.numel() * 4) for p in TinyGPT().parameters())
    untied = sum(rounded(p.numel() * 4) for p in TinyGPT(tie=False).parameters())
    assert untied - tied == VOCAB * EMBED * 4
    assert result.breakdown.by_category["parameter"] == tied
    assert result.breakdown.by_category["optimizer_state"] >= 2 * tied


def test_hf_gpt2_keeps_its_tied_head(a100, stack24):
    transformers = pytest.importorskip("transformers")
    seen = {}

    def job():
        config = transformers.GPT2Config(
            n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=16,
            bos_token_id=0, eos_token_id=0,
        )
        model = transformers.GPT2LMHeadModel(config)
        untied = sum(p.numel() for p in model.parameters()) + 128 * 32
        model.to("cuda")
        seen["tied"] = model.lm_head.weight is model.transformer.wte.weight
        seen["numel"] = (sum(p.numel() for p in model.parameters()), untied)
        model.cuda()
        seen["tied_again"] = model.lm_head.weight is model.transformer.wte.weight
        optimizer = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            ids = torch.randint(0, 128, (2, 8), device="cuda")
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    result = _run(job, a100, stack24, steps=2)
    assert seen["tied"] and seen["tied_again"]
    numel, untied = seen["numel"]
    assert numel == untied - 128 * 32
    assert result.steps == 2


def test_optimizer_built_before_the_move_steps_the_moved_parameters(a100, stack24):
    seen = {}

    def job():
        model = nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model.cuda()
        seen["same"] = optimizer.param_groups[0]["params"][0] is model.weight
        model(torch.randn(2, 8, device="cuda")).sum().backward()
        optimizer.step()  # one step: the capture stops the job after its third
        seen["momentum"] = optimizer.state[model.weight]["momentum_buffer"].device

    _run(job, a100, stack24)
    assert seen == {"same": True, "momentum": JOB_DEVICE}


def test_gradients_move_with_their_parameters(a100, stack24):
    seen = {}

    def job():
        model = nn.Linear(4, 4).cuda()
        model(torch.randn(2, 4, device="cuda")).sum().backward()
        grad = model.weight.grad
        model.cpu()
        seen["cpu"] = (model.weight.grad is grad, grad.device, model.weight.device)
        model.cuda()
        seen["cuda"] = (model.weight.grad is grad, grad.device, model.weight.device)
        model.half()
        seen["half"] = (model.weight.grad is grad, grad.dtype, model.weight.dtype)

    _run(job, a100, stack24)
    cpu = torch.device("cpu")
    assert seen["cpu"] == (True, cpu, cpu)
    assert seen["cuda"] == (True, JOB_DEVICE, JOB_DEVICE)
    assert seen["half"] == (True, torch.float16, torch.float16)


def test_tying_made_after_the_move_holds(a100, stack24):
    seen = {}

    def job():
        model = TinyGPT(tie=False).cuda()
        model.transformer.wte.weight = model.lm_head.weight
        model.to("cuda")
        seen["tied"] = model.transformer.wte.weight is model.lm_head.weight

    _run(job, a100, stack24)
    assert seen["tied"]


def test_shared_buffers_become_copies_as_on_cuda(a100, stack24):
    """`_apply` replaces buffers (`self._buffers[key] = fn(buf)`) on CUDA too: a buffer shared
    by two modules is copied once per module."""
    seen = {}

    def job():
        first, second = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
        second.running_mean = first.running_mean
        model = nn.Sequential(first, second).cuda()
        seen["shared"] = model[0].running_mean is model[1].running_mean
        seen["device"] = model[1].running_mean.device

    _run(job, a100, stack24)
    assert seen == {"shared": False, "device": JOB_DEVICE}


def test_data_assignment_across_devices_keeps_the_tensor(a100, stack24):
    seen = {}

    def job():
        weight = nn.Parameter(torch.randn(3, 3))
        weight.custom_flag = "kept"
        weight.data = weight.data.to("cuda")
        seen["after"] = (weight.device, weight.requires_grad, weight.custom_flag, type(weight))

    _run(job, a100, stack24)
    assert seen["after"] == (JOB_DEVICE, True, "kept", nn.Parameter)


def test_values_survive_the_moves_in_eager_mode(a100, stack24):
    seen = {}
    values = torch.randn(4, 4)

    def job():
        model = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            model.weight.copy_(values)
        model.cuda()
        seen["device"] = model.weight.cpu().clone()
        model.cpu()
        seen["host"] = model.weight.detach().clone()

    _run(job, a100, stack24, mode="eager")
    assert torch.equal(seen["device"], values) and torch.equal(seen["host"], values)


def test_lazy_modules_moved_before_their_first_call(a100, stack24):
    """On CUDA `.cuda()` keeps a lazy module's UninitializedParameter (it materializes on the
    first call, on the device); the capture used to turn it into a plain empty Parameter."""
    seen = {}

    def job():
        model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(2)).cuda()
        seen["before"] = (type(model[0].weight).__name__, model[0].weight.device)
        optimizer = None
        for _ in range(3):
            model(torch.randn(3, 5, device="cuda")).sum().backward()
            optimizer = optimizer or torch.optim.Adam(model.parameters())
            optimizer.step()
            seen["after"] = (model[0].weight.shape, model[0].weight.device)

    result = _run(job, a100, stack24)
    assert seen["before"] == ("UninitializedParameter", JOB_DEVICE)
    assert seen["after"] == (torch.Size([8, 5]), JOB_DEVICE)
    assert result.steps == 3


class MomentumPair(nn.Module):
    """MoCo / BYOL: a trained encoder and a momentum copy whose weights are replaced each
    forward (`param_k.data = param_k.data * m + param_q.data * (1 - m)`), never stepped."""

    def __init__(self):
        super().__init__()
        self.online = nn.Linear(256, 256)
        self.momentum = nn.Linear(256, 256)
        for param in self.momentum.parameters():
            param.requires_grad = False

    def forward(self, x):
        with torch.no_grad():
            for param_q, param_k in zip(self.online.parameters(), self.momentum.parameters(),
                                        strict=True):
                param_k.data = param_k.data * 0.99 + param_q.data * 0.01
            key = self.momentum(x)
        return (self.online(x) * key).sum()


def train_momentum_pair():
    model = MomentumPair().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        loss = model(torch.randn(8, 256, device="cuda"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_weights_computed_into_a_parameter_are_parameters():
    result = estimate(train_momentum_pair, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    one_encoder = rounded(256 * 256 * 4) + rounded(256 * 4)
    # the momentum encoder's new weights were made in the forward: they were counted as
    # activations (saved for backward) before, though they are weights: computed from the
    # trained encoder's, a copy kept in sync (`ema`, capture/weight_copies.py)
    assert result.breakdown.by_category["parameter"] == one_encoder
    assert result.breakdown.by_category["ema"] == one_encoder
    assert result.breakdown.by_category["optimizer_state"] == one_encoder


def test_module_to_a_device_tensor_moves_it_to_the_device(a100, stack24):
    """byol-pytorch builds its projector on first call with `MLP(...).to(hidden)`: `_parse_to`
    read the fake tensor's true device (meta), so the projector went to the meta device and its
    weights, gradients and Adam state were missing from the estimate."""
    seen = {}

    def job():
        hidden = torch.randn(4, 64, device="cuda")
        projector = nn.Linear(64, 256).to(hidden)
        seen["device"] = projector.weight.device
        projector(hidden).sum().backward()

    result = _run(job, a100, stack24, mode="fake")
    assert seen["device"] == JOB_DEVICE
    weights = [size for size, tag in allocations(result.trace) if tag.category == "parameter"]
    assert sorted(weights) == [256 * 4, 256 * 64 * 4]


class _Schedule(nn.Module):
    """A wrapper holding buffers whose own forward never runs (denoising-diffusion's
    GaussianDiffusion sampled through its inner network's forward)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 8)
        self.register_buffer("betas", torch.linspace(0, 1, 1000))
        self.register_buffer("step", torch.tensor(0))


def test_buffers_moved_with_their_module_are_buffers(a100, stack24):
    def job():
        model = _Schedule().to("cuda")
        with torch.no_grad():
            model.net(torch.randn(2, 8, device="cuda"))  # the wrapper's forward never runs

    result = _run(job, a100, stack24, mode="fake")
    buffers = [size for size, tag in allocations(result.trace) if tag.category == "buffer"]
    # both were tagged `input` (host copies) before
    assert sorted(buffers) == [8, 1000 * 4]
