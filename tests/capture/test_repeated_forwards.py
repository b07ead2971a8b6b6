"""Repeated no-grad forwards (capture.repeated_forwards): an evaluation loop's identical calls
are replayed once they provably repeat; the estimate, every trace event and the per-op cost
record are those of the run that made every call. Forwards with side effects run for real."""

import dataclasses
import time

import torch
from torch import nn
from torch.nn import functional as F

from peakmem.capture.length_family import OBSERVED, RECHECK_EVERY
from peakmem.capture.repeated_forwards import ENV_FLAG, REQUIRED_WINDOWS
from peakmem.estimate import estimate

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}
REPLAYED = "no-grad forward call(s) replayed"
EVAL_ITERS = 12


def run(monkeypatch, job, *, replay: bool, steps=3):
    """The estimate JSON (without seconds and the replay note), every trace event and tag, the
    trace metadata (the utilization record), and the replayed-call count from the note."""
    with monkeypatch.context() as patch:
        patch.setenv(ENV_FLAG, "1" if replay else "0")
        result = estimate(job, steps=steps, **GPU)
    data = result.to_json()
    data.pop("seconds", None)
    notes = data.pop("notes")
    data["notes"] = [n for n in notes if REPLAYED not in n]
    trace = result.capture.trace
    data["trace"] = [list(trace.kinds), list(trace.ids), list(trace.sizes), list(trace.streams),
                     [None if t is None else t.to_json() for t in map(trace.tag_of, range(len(trace)))]]
    data["meta"] = trace.meta
    replayed = [int(n.split()[0]) for n in notes if REPLAYED in n]
    return data, (replayed[0] if replayed else 0)


def assert_same(monkeypatch, job, **options):
    full, none = run(monkeypatch, job, replay=False, **options)
    fast, replayed = run(monkeypatch, job, replay=True, **options)
    assert none == 0
    assert fast == full
    return replayed


class Head(nn.Module):
    def __init__(self, n_embd, head_size, block_size, dropout):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        _, t, _ = x.shape
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:t, :t] == 0, float("-inf"))
        wei = self.dropout(F.softmax(wei, dim=-1))
        return wei @ self.value(x)


class TinyGPT(nn.Module):
    """ng-video-lecture's GPTLanguageModel, small: (logits, loss) from (idx, targets)."""

    def __init__(self, vocab=65, n_embd=32, n_head=2, n_layer=2, block_size=16, dropout=0.2):
        super().__init__()
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(
            nn.ModuleList([nn.LayerNorm(n_embd),
                           nn.ModuleList(Head(n_embd, n_embd // n_head, block_size, dropout)
                                         for _ in range(n_head)),
                           nn.Linear(n_embd, n_embd), nn.LayerNorm(n_embd),
                           nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.ReLU(),
                                         nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout))])
            for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab)

    def forward(self, idx, targets=None):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for ln1, heads, proj, ln2, ffwd in self.blocks:
            h = ln1(x)
            x = x + proj(torch.cat([head(h) for head in heads], dim=-1))
            x = x + ffwd(ln2(x))
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        logits = logits.view(b * t, -1)
        return logits, F.cross_entropy(logits, targets.view(b * t))


def get_batch():
    data = torch.randint(0, 65, (1000,))
    ix = torch.randint(len(data) - 16, (4,))
    x = torch.stack([data[i:i + 16] for i in ix])
    y = torch.stack([data[i + 1:i + 17] for i in ix])
    return x.to("cuda"), y.to("cuda")


def gpt_job(model_factory=TinyGPT, eval_forward=None, eval_mode=True, seen=None):
    """nanoGPT's loop: estimate_loss (`EVAL_ITERS` no-grad forwards per split) at step 0, then
    training steps with AdamW."""

    def train():
        model = model_factory().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        @torch.no_grad()
        def estimate_loss():
            if eval_mode:
                model.eval()
            out = {}
            for split in ("train", "val"):
                losses = torch.zeros(EVAL_ITERS)
                for k in range(EVAL_ITERS):
                    xb, yb = get_batch()
                    _, loss = (eval_forward or model)(xb, yb)
                    losses[k] = loss.item()
                    if seen is not None:
                        seen.append(loss)
                out[split] = losses.mean()
            model.train()
            return out

        for it in range(100):
            if it % 2 == 0:
                estimate_loss()
            xb, yb = get_batch()
            _, loss = model(xb, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return train


def test_gpt_eval_loop_replayed_trace_identical(monkeypatch):
    replayed = assert_same(monkeypatch, gpt_job())
    # two estimate_loss calls ran (steps 0 and 2), two splits of EVAL_ITERS each; per key
    # (phase and tracker state, module tree), REQUIRED_WINDOWS calls observed before replaying
    assert replayed == 2 * (2 * EVAL_ITERS - REQUIRED_WINDOWS - 1)


def test_replay_is_faster(monkeypatch):
    timings = {}
    for replay in (False, True):
        begin = time.perf_counter()
        _, replayed = run(monkeypatch, gpt_job(), replay=replay)
        timings[replay] = time.perf_counter() - begin
    assert replayed > 0
    assert timings[True] < timings[False]


def test_outputs_freed_when_the_job_drops_them(monkeypatch):
    # the job keeps every eval loss: their storages stay allocated, as in the real run
    kept: list = []
    replayed = assert_same(monkeypatch, gpt_job(seen=kept))
    assert replayed > 0


# -- refusals: each forward runs for real (no call replayed), the estimate unchanged ------------
class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x, y):
        out = self.bn(self.lin(x.float()))
        return out, F.mse_loss(out, y.float()[:, :16].expand_as(out) * 0 + out.detach())


def small_job(model_factory, train_mode_eval=False, model_call=None):
    def train():
        model = model_factory().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            with torch.no_grad():
                if not train_mode_eval:
                    model.eval()
                for _ in range(8):
                    x = torch.randn(4, 16, device="cuda")
                    out = (model_call or model)(model, x) if model_call else model(x, x)
                    out[1].item()
                model.train()
            out = model(torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda"))
            loss = out.loss if isinstance(out, Output) else out[1]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    return train


def test_batchnorm_running_stats_in_train_mode_run_for_real(monkeypatch):
    assert assert_same(monkeypatch, small_job(BatchNormNet, train_mode_eval=True)) == 0


def test_batchnorm_eval_mode_is_replayed(monkeypatch):
    assert assert_same(monkeypatch, small_job(BatchNormNet)) > 0


def test_dropout_in_train_mode_runs_for_real(monkeypatch):
    assert assert_same(monkeypatch, gpt_job(eval_mode=False)) == 0


class CachingNet(nn.Module):
    """Assigns an attribute in its forward (a cache): its calls have a side effect."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.cache = None

    def forward(self, x, y):
        out = self.lin(x)
        self.cache = out
        return out, out.sum()


def test_attribute_assignment_runs_for_real(monkeypatch):
    assert assert_same(monkeypatch, small_job(CachingNet)) == 0


class KVCacheNet(nn.Module):
    """Writes into a buffer that outlives the call (a KV cache)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("kv", torch.zeros(4, 16))

    def forward(self, x, y):
        out = self.lin(x)
        self.kv.copy_(out)
        return out, out.sum()


def test_in_place_write_to_a_buffer_runs_for_real(monkeypatch):
    assert assert_same(monkeypatch, small_job(KVCacheNet)) == 0


KEPT: list = []


class KeepingNet(nn.Module):
    """Keeps a tensor it made somewhere else (a global list)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, y):
        out = self.lin(x)
        KEPT.append(out * 2)
        return out, out.sum()


def test_tensor_kept_elsewhere_runs_for_real(monkeypatch):
    KEPT.clear()
    assert assert_same(monkeypatch, small_job(KeepingNet)) == 0
    KEPT.clear()


class MaskedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, y):
        out = self.lin(x)
        picked = out[out > 0]  # a data-dependent shape
        return out, picked.sum()


def test_data_dependent_shape_runs_for_real(monkeypatch):
    assert assert_same(monkeypatch, small_job(MaskedNet)) == 0


class HostReadNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, y):
        out = self.lin(x)
        scale = float(out.abs().max())  # a host read inside the forward
        return out, (out * scale).sum()


def test_host_read_inside_the_forward_runs_for_real(monkeypatch):
    assert assert_same(monkeypatch, small_job(HostReadNet)) == 0


class AliasNet(nn.Module):
    """Returns its input (an output aliasing an input) and its weight."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, y):
        return x, self.lin(x).sum(), self.lin.weight


def test_outputs_aliasing_inputs_or_parameters_run_for_real(monkeypatch):
    assert assert_same(monkeypatch, small_job(AliasNet)) == 0


class HookedNet(BatchNormNet):
    pass


def test_module_hooks_run_for_real(monkeypatch):
    calls = []

    def factory():
        model = HookedNet()
        model.lin.register_forward_hook(lambda *a: calls.append(1))
        return model

    assert assert_same(monkeypatch, small_job(factory)) == 0
    assert calls


def test_side_stream_runs_for_real(monkeypatch):
    def call(model, x):
        with torch.cuda.stream(torch.cuda.Stream()):
            return model(x, x)

    assert assert_same(monkeypatch, small_job(BatchNormNet, model_call=call)) == 0


def test_grad_enabled_forward_is_never_replayed(monkeypatch):
    def call(model, x):
        with torch.enable_grad():
            return model(x, x)

    assert assert_same(monkeypatch, small_job(BatchNormNet, model_call=call)) == 0


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class DataclassNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, y):
        logits = self.lin(x)
        return Output(logits=logits, loss=logits.view(-1).sum())


def test_dataclass_output_is_replayed(monkeypatch):
    def call(model, x):
        out = model(x, x)
        assert isinstance(out, Output) and out.logits.shape == (4, 16) and out.logits.is_cuda
        return out.logits, out.loss

    assert assert_same(monkeypatch, small_job(DataclassNet, model_call=call)) > 0


class PositionsNet(nn.Module):
    """Returns `torch.arange` on the device: a tensor whose host values the capture knows."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, y):
        out = self.lin(x)
        return out, out.sum(), torch.arange(4, device=x.device)


def test_outputs_with_known_host_values_run_for_real(monkeypatch):
    sums = []

    def call(model, x):
        out = model(x, x)
        sums.append(sum(out[2].tolist()))
        return out

    assert assert_same(monkeypatch, small_job(PositionsNet, model_call=call)) == 0
    assert set(sums) == {6}  # 0 + 1 + 2 + 3, read on the host from the known values


def test_hf_model_output_is_replayed(monkeypatch):
    from transformers.modeling_outputs import CausalLMOutput

    class HFNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x, y):
            logits = self.lin(x)
            return CausalLMOutput(loss=logits.sum(), logits=logits)

    seen = []

    def call(model, x):
        out = model(x, x)
        seen.append((type(out), list(out.keys()), out[0].shape, out.logits.shape))
        return out.logits, out.loss

    def train():  # small_job's loop, the training loss read from the ModelOutput
        model = HFNet().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            with torch.no_grad():
                model.eval()
                for _ in range(8):
                    call(model, torch.randn(4, 16, device="cuda"))[1].item()
                model.train()
            loss = model(torch.randn(4, 16, device="cuda"), None).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    assert assert_same(monkeypatch, train) > 0
    assert {entry[0] for entry in seen} == {CausalLMOutput}
    assert {tuple(entry[1]) for entry in seen} == {("loss", "logits")}
    assert {entry[2] for entry in seen} == {torch.Size([])}


def test_memory_cap_runs_for_real(monkeypatch):
    def call(model, x):
        torch.cuda.set_per_process_memory_fraction(0.5)  # an OOM could come in any call
        return model(x, x)

    assert assert_same(monkeypatch, small_job(BatchNormNet, model_call=call)) == 0


def test_cuda_graph_capture_runs_for_real(monkeypatch):
    def call(model, x):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            return model(x, x)

    assert assert_same(monkeypatch, small_job(BatchNormNet, model_call=call)) == 0


def generate_job(new_tokens=40, block_size=16):
    """minGPT / nanoGPT `generate` after training: each call's input is the last `block_size`
    tokens of a growing sequence (`idx[:, -block_size:]`), a view whose row stride (a size-1
    dimension's) and storage offset change every call."""

    def train():
        model = TinyGPT(block_size=block_size).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            xb, yb = get_batch()
            _, loss = model(xb, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        idx = torch.zeros((1, 4), dtype=torch.long, device="cuda")
        with torch.no_grad():
            for _ in range(new_tokens):
                idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
                logits, _ = model(idx_cond)
                probs = F.softmax(logits[:, -1, :], dim=-1)
                idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)

    return train


def test_sliding_window_generation_is_replayed(monkeypatch):
    # lengths 4 .. 15 are distinct keys; the 28 calls at the full window share two (a size-1
    # dimension's stride and the storage offset are not in the key: neither changes what a
    # fake-mode call allocates; the offset's 16-byte alignment is, and an int64 window that
    # slides by one token alternates between two), REQUIRED_WINDOWS of each observed before
    # replaying the rest (before: none replayed, every call its own key)
    # since length_family: the first call after training is no template (the phase moves);
    # lengths 5 .. 8 are observed, 9 .. 16 predicted (8), and the full window at an even
    # offset (alignment 0: the same family, length 16) predicted too but for the family's
    # 16th call (checked for real): 12; the odd offsets are one exact key: 14 - 3
    replayed = assert_same(monkeypatch, generate_job(), steps="all")
    assert replayed == 8 + (13 - 1) + (14 - REQUIRED_WINDOWS)


def test_growing_length_generation_is_predicted(monkeypatch):
    # no sliding window (block 64): 40 calls at lengths 4 .. 43, each its own exact key (none
    # replayed before length_family); the first is no template (the phase moves after
    # training), OBSERVED calls fit and check the family, the rest are predicted but for
    # every RECHECK_EVERY-th (run for real and compared); every event equals the op-by-op run
    replayed = assert_same(monkeypatch, generate_job(block_size=64), steps="all")
    family_calls = 40 - 1 - OBSERVED
    assert replayed == family_calls - family_calls // RECHECK_EVERY
    assert replayed == 33


class CubicNet(nn.Module):
    """A scratch allocation cubic in the length: no degree-2 fit predicts it."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(65, 8)

    def forward(self, idx):
        t = idx.shape[1]
        scratch = torch.empty(t * t * t, device=idx.device)
        return self.emb(idx).sum() + scratch.sum()


def test_length_family_that_does_not_fit_runs_for_real(monkeypatch):
    def job():
        model = CubicNet().cuda().eval()
        idx = torch.zeros((1, 4), dtype=torch.long, device="cuda")
        with torch.no_grad():
            for _ in range(20):
                model(idx)
                idx = torch.cat((idx, idx[:, :1]), dim=1)

    assert assert_same(monkeypatch, job, steps="all") == 0


class StepNet(nn.Module):
    """A scratch allocation that appears only past length 12: constant (absent) over the
    observed lengths, so the fit carries it on until a check runs a call for real."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(65, 8)

    def forward(self, idx):
        out = self.emb(idx)
        if idx.shape[1] > 12:
            out = out + torch.zeros(1024, 8, device=idx.device)[: idx.shape[1]]
        return out.sum()


def test_a_step_past_the_observed_lengths_is_caught_and_reported(monkeypatch):
    def job():
        model = StepNet().cuda().eval()
        idx = torch.zeros((1, 4), dtype=torch.long, device="cuda")
        with torch.no_grad():
            for _ in range(30):
                model(idx)
                idx = torch.cat((idx, idx[:, :1]), dim=1)

    full, _ = run(monkeypatch, job, replay=False, steps="all")
    with monkeypatch.context() as patch:
        patch.setenv(ENV_FLAG, "1")
        result = estimate(job, steps="all", **GPU)
    note = next(n for n in result.to_json()["notes"] if REPLAYED in n)
    # lengths 4 .. 7 observed; 8 .. 22 replayed without the scratch that appears at 13; the
    # check at the family's 16th call (length 23) runs it and finds other events: the 15
    # calls before it are reported as in doubt, and they do differ from the op-by-op trace
    assert f"({RECHECK_EVERY - 1} of those before a check that found the fit wrong" in note
    trace = result.capture.trace
    assert list(trace.sizes) != full["trace"][2]
