"""The k11 adversarial sweep's regressions (benchmarks/hostile_sweep_k11.py runs the whole sweep):
one test per class of hostile input that broke the contract before its fix. Each docstring says
what went wrong."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from peakmem.capture import capture_callable
from peakmem.capture.recorder_guard import NOTE
from peakmem.profiles import load_gpu, load_stack

GIB = 1 << 30
MIB = 1 << 20


def _capture(job):
    return capture_callable(job, gpu=load_gpu("a100-40gb"), stack=load_stack("2.4.1"))


# -- device work with peakmem's dispatch mode turned off (k9's open failure) ----------------------


def _disable_current_modes():
    from torch.utils._python_dispatch import _disable_current_modes
    return _disable_current_modes()


def _pop_mode_temporarily():
    from torch.utils._python_dispatch import _pop_mode_temporarily
    return _pop_mode_temporarily()


@pytest.mark.parametrize("modes_off", [_disable_current_modes, _pop_mode_temporarily,
                                       torch._C._DisableTorchDispatch])
def test_device_work_with_the_dispatch_modes_off_is_recorded(modes_off):
    """The job turned the dispatch modes off around a device allocation: the torch-function mode
    still put it on the meta device, but no dispatch mode saw it, so the second GiB went
    unrecorded (peak 1 GiB, exit 0). Now the recorder is put back for that call, with a note."""

    def job():
        keep = torch.empty(GIB, dtype=torch.uint8, device="cuda")
        with modes_off():
            more = torch.empty(GIB, dtype=torch.uint8, device="cuda")
            doubled = more + 1  # an op on a device tensor there: recorded as well
        return keep, more, doubled

    result = _capture(job)
    assert result.error is None, result.error_text
    assert result.trace.sizes.count(GIB) == 3
    assert NOTE in result.notes


def test_an_ordinary_job_gets_no_modes_off_note():
    def job():
        model = torch.nn.Linear(16, 16).cuda()
        model(torch.randn(4, 16, device="cuda")).sum().backward()

    result = _capture(job)
    assert result.error is None and NOTE not in result.notes


# -- sparse CSR / COO device tensors (k10's open failures) ----------------------------------------

N = 1 << 12  # a 4096 x 4096 float32 matrix: 64 MiB


def test_a_device_tensor_made_csr_holds_every_entry():
    """`to_sparse_csr()` of a device tensor had no meta kernel: the job failed in the capture as
    if it had raised. Now CSR holds every value as an entry (the bound, stated as a data-dependent
    assumption): values 64 MiB, column indices 128 MiB (int64), row pointers N + 1 int64."""

    def job():
        dense = torch.randn(N, N, device="cuda")
        csr = dense.to_sparse_csr()
        assert csr.layout == torch.sparse_csr and csr.shape == (N, N)
        product = csr @ torch.randn(N, 8, device="cuda")  # SparseCsrMeta addmm.out
        assert product.shape == (N, 8) and product.layout == torch.strided
        return csr, product

    result = _capture(job)
    assert result.error is None, result.error_text
    sizes = result.trace.sizes
    assert sizes.count(64 * MIB) >= 2 and 128 * MIB in sizes
    assert (N + 1) * 8 in sizes
    assert result.data_dependent == {"aten::_to_sparse_csr": 1}


def test_a_sparse_tensor_of_zeros_made_dense_again():
    """`torch.zeros(...).to_sparse().to_dense()`: `_to_dense` had no SparseMeta kernel (the
    capture failed, and its eager rerun failed with "Cannot access storage of SparseTensorImpl").
    Now the dense result is a tensor of the shape; the COO holds the all-nonzero bound (indices
    2 x N^2 int64 = 256 MiB), an assumption the estimate states."""

    def job():
        sparse = torch.zeros(N, N, device="cuda").to_sparse()
        dense = sparse.to_dense()
        assert dense.shape == (N, N) and dense.layout == torch.strided
        return sparse, dense

    result = _capture(job)
    assert result.error is None, result.error_text
    assert 256 * MIB in result.trace.sizes and result.trace.sizes.count(64 * MIB) >= 3
    assert result.data_dependent == {"aten::_to_sparse": 1}


def test_a_csr_tensor_built_on_the_device_multiplies():
    def job():
        crow = torch.tensor([0, 1, 2], device="cuda")
        col = torch.tensor([0, 1], device="cuda")
        csr = torch.sparse_csr_tensor(crow, col, torch.ones(2, device="cuda"), (2, 2), device="cuda")
        out = torch.sparse.mm(csr, torch.randn(2, 4096, device="cuda"))
        assert out.shape == (2, 4096)
        return out

    result = _capture(job)
    assert result.error is None, result.error_text
    assert 2 * 4096 * 4 in result.trace.sizes


# -- module names in the text report --------------------------------------------------------------


def test_module_names_are_plain_one_line_text_in_the_report():
    """A module named `[/x]` (the job's `_modules` key) made rich raise MarkupError rendering the
    top-modules table: a peakmem traceback after the estimate. Names with line breaks or a bidi
    override printed as they were (a name could forge table rows). Now: plain text, escaped."""
    from types import SimpleNamespace

    from peakmem.estimate import report

    rows = [("Sequential.[/x]", GIB), ("Sequential.a\nFITS: yes", MIB), ("m.\u202eevil", MIB)]
    console = Console(file=io.StringIO(), width=200, color_system=None)
    report._render_modules(SimpleNamespace(breakdown=SimpleNamespace(top_modules=lambda: rows)),
                           console)
    out = console.file.getvalue()
    assert "Sequential.[/x]" in out
    assert "Sequential.a\\nFITS: yes" in out and "\u202e" not in out and "m.\\u202eevil" in out
    assert len([line for line in out.splitlines() if "MiB" in line or "GiB" in line]) == 3


# -- a host read inside a CUDA graph capture ------------------------------------------------------


def test_a_host_read_inside_a_graph_capture_fails_as_cuda_fails_it():
    """`.item()` inside `torch.cuda.graph(g)`: CUDA refuses the sync on a capturing stream
    (the job fails on the GPU), but the capture answered zeros and the estimate came out with
    exit 0. Now it raises CUDA's error; a read after the capture still works."""
    from peakmem.capture.device_map import GRAPH_CAPTURE_HOST_READ

    seen = []

    def job():
        x = torch.ones(4, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError) as refused, torch.cuda.graph(graph):
            (x * 2).sum().item()
        seen.append(str(refused.value))
        seen.append((x * 2).sum().item())  # after the capture: a host read as usual

    result = _capture(job)
    assert result.error is None, result.error_text
    assert seen[0] == GRAPH_CAPTURE_HOST_READ and isinstance(seen[1], float)


# -- a results path that is rich markup -----------------------------------------------------------


def test_a_batch_results_path_that_is_markup_is_printed_as_it_is(tmp_path, monkeypatch):
    """`peakmem batch -o 'r[/x].jsonl' jobs.jsonl`: the summary line printed the path through
    rich markup, which raised MarkupError: `peakmem internal error`, exit 70, after the jobs ran.
    Now the path is printed as it is."""
    from click.testing import CliRunner

    from peakmem.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "jobs.jsonl").write_text('{"id": "a", "command": ["python", "t.py"]}\n')
    result = CliRunner().invoke(main, [
        "batch", "--in-process", "--estimator", "peakmem.service.estimators:fake_estimator",
        "-o", "r[/x].jsonl", "jobs.jsonl"])
    assert result.exit_code == 0, result.output
    assert "results in r[/x].jsonl" in result.output
    assert (tmp_path / "r[" / "x].jsonl").is_file()


# -- a checkpoint whose file name is not UTF-8 ----------------------------------------------------


def test_a_checkpoint_named_with_a_surrogate_escape_loads(tmp_path):
    """`torch.load('sd\\udc80.pt')` (a file name with a byte that is not UTF-8): the capture's
    torch.load memory-maps checkpoints, and `UntypedStorage.from_file` cannot encode the name:
    UnicodeEncodeError, reported as the job's failure, where the job's own load (no mmap) reads
    it. Now such a name is loaded without mmap; its keys (surrogates too) come back."""
    path = tmp_path / "sd\udc80.pt"
    seen = []

    def job():
        saved = {"w\udc80\u202e": torch.empty(MIB, dtype=torch.uint8, device="cuda")}
        torch.save(saved, path)
        back = torch.load(path)
        seen.append((list(back), back["w\udc80\u202e"].device.type))
        return back

    result = _capture(job)
    assert result.error is None, result.error_text
    assert seen == [(["w\udc80\u202e"], "cuda")]
    assert result.trace.sizes.count(MIB) == 2  # saved, and loaded back onto the device


# -- device storages made directly ----------------------------------------------------------------


def _peak_live(trace) -> int:
    from peakmem.trace.events import EventKind

    live, peak = {}, 0
    for kind, ident, size, _stream, _tag in trace.events():
        if kind == EventKind.ALLOC:
            live[ident] = size
            peak = max(peak, sum(live.values()))
        elif kind == EventKind.FREE:
            live.pop(ident, None)
    return peak


def test_a_device_storage_made_directly_is_allocated_while_the_job_holds_it():
    """`torch.UntypedStorage(n, device="cuda")` (and `TypedStorage`, `set_` onto it) is no torch
    function: torch refused the device ("Storage device not recognized: cuda"), reported as the
    job's failure. Now it is an allocation of n bytes, live while the job holds the storage."""

    def job():
        storage = torch.UntypedStorage(GIB, device="cuda")
        assert storage.nbytes() == GIB
        view = torch.empty(0, dtype=torch.uint8, device="cuda").set_(storage)
        typed = torch.TypedStorage(MIB, dtype=torch.float32, device="cuda")
        more = torch.empty(GIB, dtype=torch.uint8, device="cuda")  # the storage still held: 2 GiB
        del storage, view, more
        again = torch.empty(GIB, dtype=torch.uint8, device="cuda")  # freed: the peak stays
        host = torch.UntypedStorage(16)  # a host storage as before
        assert host.device.type == "cpu" and host.nbytes() == 16
        return typed, again

    result = _capture(job)
    assert result.error is None, result.error_text
    assert result.trace.sizes.count(GIB) == 3 and 4 * MIB in result.trace.sizes
    assert _peak_live(result.trace) == 2 * GIB + 4 * MIB
    assert "__new__" not in vars(torch.UntypedStorage)  # torch's own constructor back
    assert torch.UntypedStorage(8).nbytes() == 8


# -- device tensors exported out of torch's reach -------------------------------------------------


@pytest.mark.parametrize("export, names", [
    (lambda x: torch.utils.dlpack.to_dlpack(x), "DLPack export"),
    (lambda x: torch.from_dlpack(x), "DLPack export"),
    (lambda x: x.untyped_storage()._share_cuda_(), "CUDA IPC sharing"),
])
def test_a_device_tensor_exported_is_unsupported_in_one_line(export, names):
    """DLPack capsules and CUDA IPC handles of a fake device tensor raised torch's own errors
    ("Cannot pack tensors on meta", "CUDA is not available"), reported as the job's failure.
    Now: `unsupported` (exit 3), one line naming the call; host tensors export as before."""
    from peakmem.capture.unsupported import Unsupported

    def job():
        host = torch.ones(4)
        assert torch.from_dlpack(torch.utils.dlpack.to_dlpack(host)).tolist() == [1.0] * 4
        export(torch.empty(16, device="cuda"))

    result = _capture(job)
    assert isinstance(result.error, Unsupported) and result.reason == "unsupported"
    assert result.error_text.startswith(f"peakmem does not support {names}")
    assert "\n" not in result.error_text


# -- nested tensors on the device -----------------------------------------------------------------


def test_strided_nested_device_tensors_are_unsupported_jagged_ones_run():
    """`torch.nested.nested_tensor([a, b])` of device tensors (strided layout) failed with
    torch's "INTERNAL ASSERT FAILED" on the meta storages, reported as the job's failure. Now:
    `unsupported`, one line; the jagged layout runs and is recorded (a copy of both tensors)."""
    from peakmem.capture.nested_tensors import STRIDED_NESTED
    from peakmem.capture.unsupported import Unsupported

    def jagged():
        parts = [torch.empty(MIB, device="cuda"), torch.empty(MIB, device="cuda")]
        return torch.nested.nested_tensor(parts, layout=torch.jagged)

    def strided():
        torch.nested.as_nested_tensor([torch.empty(8, device="cuda")])

    result = _capture(jagged)
    assert result.error is None, result.error_text
    assert result.trace.sizes.count(4 * MIB) == 2 and 8 * MIB in result.trace.sizes
    result = _capture(strided)
    assert isinstance(result.error, Unsupported)
    assert result.error_text == f"peakmem does not support {STRIDED_NESTED} yet"
