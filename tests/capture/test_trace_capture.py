import resource

import torch

from peakmem.capture import capture_callable
from peakmem.trace.events import EventKind
from tests.capture.capture_helpers import allocations


def linear_adam_job(steps=1):
    model = torch.nn.Linear(64, 32).to("cuda")
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(steps):
        x = torch.randn(16, 64).to("cuda")
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()


def test_linear_adam_step_has_parameters_gradients_and_two_moments(a100, stack24):
    result = capture_callable(linear_adam_job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert result.steps == 1 and result.stopped
    trace = result.trace
    weight, bias = 64 * 32 * 4, 32 * 4
    sizes = lambda category: sorted(size for size, _ in allocations(trace, category))  # noqa: E731
    assert sizes("parameter") == sorted([weight, bias])
    assert sizes("gradient") == sorted([weight, bias])
    assert sizes("optimizer_state") == sorted([weight, weight, bias, bias])
    assert sizes("input") == [16 * 64 * 4]
    # gradients come from backward, moments from the optimizer, with module paths
    assert {tag.phase for _, tag in allocations(trace, "gradient")} == {"backward"}
    assert {tag.phase for _, tag in allocations(trace, "optimizer_state")} == {"optimizer"}
    assert {tag.module for _, tag in allocations(trace, "parameter")} == {"Linear"}


def test_frees_follow_allocations_and_the_job_stops_after_n_steps(a100, stack24):
    result = capture_callable(linear_adam_job, gpu=a100, stack=stack24, steps=2, **{})
    # linear_adam_job(steps=1) never reaches 2 optimizer steps: it ends by itself
    assert result.steps == 1 and not result.stopped
    result = capture_callable(lambda: linear_adam_job(100), gpu=a100, stack=stack24, steps=3)
    assert result.steps == 3 and result.stopped
    trace = result.trace
    allocated = set()
    for kind, ident, *_ in trace.events():
        if kind == EventKind.ALLOC:
            allocated.add(ident)
        elif kind == EventKind.FREE:
            assert ident in allocated
    marks = [trace.tag_of(i).op for i, k in enumerate(trace.kinds) if k == EventKind.MARK]
    assert marks.count("forward") == 3 and "step 3" in marks


def test_what_forward_leaves_for_backward_is_activation_the_rest_temporary(a100, stack24):
    def job():
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).cuda()
        x = torch.randn(8, 32, device="cuda")
        loss = model(x).square().sum()
        loss.backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    activations = allocations(result.trace, "activation", phase="forward")
    # relu saves its output, square (pow) its input; the loss itself is alive too
    assert [tag.op for _, tag in activations] == ["relu.default", "sum.default"]
    temporaries = allocations(result.trace, "temporary", phase="forward")
    assert [tag.op for _, tag in temporaries] == ["addmm.default", "pow.Tensor_Scalar"]


def test_a_discarded_forward_frees_its_graph_at_once(a100, stack24):
    def job():
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32)).cuda()
        x = torch.randn(8, 32, device="cuda")
        model(x)  # output discarded: autograd's graph and its saved tensors go with it
        torch.cuda.synchronize()
        model(x)

    result = capture_callable(job, gpu=a100, stack=stack24)
    trace = result.trace
    addmms = [i for i in range(len(trace)) if trace.kinds[i] == EventKind.ALLOC and trace.tag_of(i).op == "addmm.default"]
    sizes = sorted(trace.live_at(addmms[2] - 1).values())  # just before the second forward
    # only the parameters, the input and the persistent cuBLAS workspace survive
    assert sizes == sorted([32 * 32 * 4] * 2 + [32 * 4] * 2 + [8 * 32 * 4, 8519680])


def test_dataloader_with_pin_memory_and_a_smaller_last_batch(a100, stack24):
    def job():
        data = torch.utils.data.TensorDataset(torch.randn(20, 8))
        loader = torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True)
        for (batch,) in loader:
            batch.to("cuda", non_blocking=True)

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert [size for size, _ in allocations(result.trace, "input")] == [256, 256, 128]


def test_a_70b_parameter_model_builds_without_memory(a100, stack24):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    width, layers = 16384, 261  # 261 * 16384**2 = 70.06e9 parameters

    def job():
        with torch.device("cuda"):
            model = torch.nn.Sequential(
                *[torch.nn.Linear(width, width, bias=False, dtype=torch.bfloat16) for _ in range(layers)]
            )
        return model

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    total = sum(size for size, _ in allocations(result.trace))
    assert total == layers * width * width * 2
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 512 * 1024  # well under 0.5 GiB for a 140 GB model


def loader_job(samples, batch, epochs=50):
    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(samples, 8))
        for _epoch in range(epochs):
            for (x,) in torch.utils.data.DataLoader(data, batch_size=batch):
                model(x.cuda()).sum().backward()
                optimizer.step()

    return job


def input_rows(trace):
    return [size // (8 * 4) for size, _ in allocations(trace, "input")]


def test_default_steps_cover_a_short_epoch_and_its_smaller_last_batch(a100, stack24):
    job = loader_job(28, 8, epochs=5)  # 4 batches an epoch
    result = capture_callable(job, gpu=a100, stack=stack24)
    # the 4-row batch, 2 steps of a new epoch, then the loop is ended: each epoch's last batch
    assert input_rows(result.trace) == [8, 8, 8, 4, 8, 8, 4, 4, 4, 4]
    assert result.steps == 10 and not result.stopped
    explicit = capture_callable(job, gpu=a100, stack=stack24, steps=2)
    assert explicit.steps == 2 and explicit.stopped


def test_long_epochs_skip_from_steady_state_to_their_last_batch(a100, stack24):
    job = loader_job(8 * 300 + 5, 8, epochs=3)  # 301 batches
    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.steps == 8 and not result.stopped
    assert input_rows(result.trace) == [8, 8, 8, 5, 8, 8, 5, 5]
    assert any("DataLoader epoch of 301 batches" in note for note in result.notes)
    # an explicit step count runs the epoch as it is
    explicit = capture_callable(loader_job(8 * 300 + 5, 8), gpu=a100, stack=stack24, steps=5)
    assert input_rows(explicit.trace) == [8, 8, 8, 8, 8]


def test_data_dependent_sizes_are_bounded_from_above(a100, stack24):
    def job():
        x = torch.randn(1000, device="cuda")
        x[x > 0].sum()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    selected = [size for size, tag in allocations(result.trace) if tag.op == "index.Tensor"]
    assert selected == [1000 * 4]  # as if every element were selected


def test_ops_without_fake_support_say_so(a100, stack24):
    def job():
        torch.bincount(torch.randint(0, 5, (10,), device="cuda"))  # no meta kernel

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.exit_code == 1 and "--mode eager" in result.error_text
