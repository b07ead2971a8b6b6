"""Reading a captured trace in tests."""

from peakmem.trace.events import EventKind


def allocations(trace, category=None, op=None, phase=None):
    """(size, tag) of every ALLOC event matching the filters, in order."""
    found = []
    for index, (kind, _ident, size, _stream, _tag) in enumerate(trace.events()):
        if kind != EventKind.ALLOC:
            continue
        tag = trace.tag_of(index)
        if category is not None and (tag is None or tag.category != category):
            continue
        if op is not None and (tag is None or not (tag.op or "").startswith(op)):
            continue
        if phase is not None and (tag is None or tag.phase != phase):
            continue
        found.append((size, tag))
    return found


def live_at_end(trace) -> list[int]:
    """Sizes of the allocations never freed (the job kept them until it ended), sorted."""
    live = {}
    for kind, ident, size, _stream, _tag in trace.events():
        if kind == EventKind.ALLOC:
            live[ident] = size
        elif kind == EventKind.FREE:
            live.pop(ident, None)
    return sorted(live.values())


def estimate_with_deferral(monkeypatch, method: str, lazy: bool, train, **job):
    """Estimate `train` with the host deferral's `method` (e.g. "_collate_stack") on (`lazy`) or
    forced off; returns (the whole estimate JSON without its seconds, with every trace event and
    tag under "trace"), how many calls took the lazy path, and the trace."""
    from peakmem.capture import host_deferred
    from peakmem.estimate import estimate

    taken = []
    original = getattr(host_deferred.HostDeferral, method)

    def spy(self, func, args, kwargs):
        out = original(self, func, args, kwargs) if lazy else NotImplemented
        taken.append(out is not NotImplemented)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(host_deferred.HostDeferral, method, spy)
        result = estimate(train, gpu="a100-40gb", steps="all", **job)
    data = result.to_json()
    data.pop("seconds", None)
    trace = result.capture.trace
    data["trace"] = [list(trace.kinds), list(trace.ids), list(trace.sizes), list(trace.streams),
                     [None if t is None else t.to_json() for t in map(trace.tag_of, range(len(trace)))]]
    return data, sum(taken), trace


def two_stacked_modes(monkeypatch) -> None:
    """Captures from now on push the device map and the host deferral as two torch-function
    modes (`HostDeferral` on top of `CudaAsMeta`), the layout before `CaptureModes`."""
    from contextlib import ExitStack, contextmanager

    from peakmem.capture import runner
    from peakmem.capture.device_map import CudaAsMeta
    from peakmem.capture.host_deferred import host_deferral

    @contextmanager
    def stacked(session, phases):
        with ExitStack() as modes:
            modes.enter_context(CudaAsMeta(session, phases))
            yield modes.enter_context(host_deferral(session))

    monkeypatch.setattr(runner, "capture_modes", stacked)


def small_cnn_training_job() -> None:
    """A small CNN training job of common calls (pinned DataLoader batches, non-blocking moves,
    device factories, Adam, a host read, a pinned host copy): the capture's fast paths' case."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ELU(),
                          nn.Dropout(0.1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(24, 3, 12, 12), torch.randint(0, 10, (24,)))
    loader = DataLoader(data, batch_size=8, pin_memory=True)
    scale = torch.tensor([0.5], device="cuda")
    for x, y in loader:
        x, y = x.to("cuda", non_blocking=True), y.cuda()
        noise = torch.zeros(x.shape, device="cuda") + torch.ones_like(x) * scale
        optimizer.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x + noise), y)
        loss.backward()
        optimizer.step()
        assert loss.item() == 0.0  # a host read: placeholder zeros
        host = torch.empty(4, pin_memory=True)
        host.copy_(loss.detach().expand(4).cpu())
