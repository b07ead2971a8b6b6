"""Optimizers whose work is steered by values fake mode does not have.

`torch.optim.LBFGS.step` runs up to `max_iter` closure evaluations and keeps up to
`history_size` pairs of parameter-sized vectors, each decided on the host from the loss and
gradient values (`if ys > 1e-10`, `abs(loss - prev_loss) < tolerance_change`). Fake mode's
zeros would stop it after one evaluation with no history: a silent underestimate.

In fake mode, an LBFGS without a line search (`line_search_fn=None`, the default: the neural
style tutorial, pytorch/examples time_sequence_prediction) takes its step at its memory bound
instead: `bounded_lbfgs_step` makes the same allocations as torch's `LBFGS.step` in the same
order, every value-steered branch taken the way that keeps memory: no early return on a small
gradient, every (y, s) pair stored (the history fills up to `history_size`, then shifts), and
iterations until `max_iter` or `max_eval` (the checks that read no values), never stopped by a
tolerance. A real run stops early only when it has converged, so this is its bound (and, for
the scripts above, what a GPU run does). With `line_search_fn="strong_wolfe"` the number of
evaluations of each line search follows the values too: that step stays a fake-mode limit
(auto mode reruns the job in eager mode, where the values are real).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.session import CaptureSession

LBFGS_REASON = (
    "torch.optim.LBFGS with line_search_fn='strong_wolfe' decides its evaluations and its "
    "history from loss and gradient values, which fake mode does not have"
)
LBFGS_NOTE = (
    "torch.optim.LBFGS: in fake mode each step ran at its memory bound (max_iter iterations, "
    "every (y, s) pair kept up to history_size; a real run stops a step early only once it "
    "has converged)"
)


@torch.no_grad()
def bounded_lbfgs_step(optimizer: torch.optim.LBFGS, closure: Any) -> Any:
    """torch's `LBFGS.step` (torch 2.x, no line search) with its value-steered branches taken
    the memory-keeping way; the tensors it makes and keeps, in `state`, are torch's."""
    if len(optimizer.param_groups) != 1:
        raise AssertionError(
            f"Expected exactly one param_group, but got {len(optimizer.param_groups)}")
    closure = torch.enable_grad()(closure)
    group = optimizer.param_groups[0]
    lr = float(group["lr"])
    max_iter, max_eval = group["max_iter"], group["max_eval"]
    history_size = group["history_size"]

    state = optimizer.state[optimizer._params[0]]
    state.setdefault("func_evals", 0)
    state.setdefault("n_iter", 0)

    orig_loss = closure()
    loss = float(orig_loss)
    current_evals = 1
    state["func_evals"] += 1
    flat_grad = optimizer._gather_flat_grad()
    # torch: `flat_grad.abs().max() <= tolerance_grad` returns here; a bound does not
    flat_grad.abs().max()

    d, t = state.get("d"), state.get("t")
    old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
    H_diag = state.get("H_diag")
    prev_flat_grad = state.get("prev_flat_grad")
    prev_loss = state.get("prev_loss")

    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        state["n_iter"] += 1
        if state["n_iter"] == 1:
            d = flat_grad.neg()
            old_dirs, old_stps, ro = [], [], []
            H_diag = 1
        else:
            y = flat_grad.sub(prev_flat_grad)
            s = d.mul(t)
            ys = y.dot(s)
            # torch: only `if ys > 1e-10`; a bound keeps every pair
            if len(old_dirs) == history_size:
                old_dirs.pop(0)
                old_stps.pop(0)
                ro.pop(0)
            old_dirs.append(y)
            old_stps.append(s)
            ro.append(1.0 / ys)
            H_diag = ys / y.dot(y)
            num_old = len(old_dirs)
            if "al" not in state:
                state["al"] = [None] * history_size
            al = state["al"]
            # torch passes the 0-d `al[i]` (and `al[i] - be_i`) as `alpha`, a host read of a
            # device value that a meta tensor cannot give: a host float allocates the same
            q = flat_grad.neg()
            for i in range(num_old - 1, -1, -1):
                al[i] = old_stps[i].dot(q) * ro[i]
                q.add_(old_dirs[i], alpha=-1.0)
            d = r = torch.mul(q, H_diag)
            for i in range(num_old):
                be_i = old_dirs[i].dot(r) * ro[i]
                al[i] - be_i
                r.add_(old_stps[i], alpha=1.0)

        if prev_flat_grad is None:
            prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
        else:
            prev_flat_grad.copy_(flat_grad)
        prev_loss = loss
        if state["n_iter"] == 1:
            flat_grad.abs().sum()  # torch: t = min(1, 1 / |g|_1) * lr (a host float)
        t = lr
        flat_grad.dot(d)  # torch: `if gtd > -tolerance_change: break`; a bound goes on

        ls_func_evals = 0
        optimizer._add_grad(t, d)
        if n_iter != max_iter:
            with torch.enable_grad():
                loss = float(closure())
            flat_grad = optimizer._gather_flat_grad()
            flat_grad.abs().max()
            ls_func_evals = 1
        current_evals += ls_func_evals
        state["func_evals"] += ls_func_evals

        # the checks that read no values; torch's tolerance checks (a small gradient, step
        # or loss change) would only stop it earlier
        if n_iter == max_iter or current_evals >= max_eval:
            break

    state["d"] = d
    state["t"] = t
    state["old_dirs"] = old_dirs
    state["old_stps"] = old_stps
    state["ro"] = ro
    state["H_diag"] = H_diag
    state["prev_flat_grad"] = prev_flat_grad
    state["prev_loss"] = prev_loss
    return orig_loss


@contextmanager
def value_steered_optimizers(session: CaptureSession) -> Iterator[None]:
    """While inside, LBFGS steps in fake mode run at their memory bound (`bounded_lbfgs_step`),
    or, with a strong-Wolfe line search, stop the job as a fake-mode limit."""
    lbfgs = torch.optim.LBFGS
    original = lbfgs.__dict__["step"]

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if session.eager:
            return original(self, *args, **kwargs)
        if self.param_groups[0]["line_search_fn"] is not None:
            if session.fake_limit is None:
                session.fake_limit = LBFGS_REASON
            raise NotImplementedError(LBFGS_REASON)
        if LBFGS_NOTE not in session.notes:
            session.notes.append(LBFGS_NOTE)
        closure = kwargs.get("closure", args[0] if args else None)
        return bounded_lbfgs_step(self, closure)

    lbfgs.step = step
    try:
        yield
    finally:
        lbfgs.step = original
