"""CPU cost of a decode loop under the capture (issue 14): ms per aten op and seconds per N
sampling steps, per source tree, alternately in one run.

    python benchmarks/decode_loop_speed.py [--steps 200] [--jobs crop,kv,xt] [--rounds 2]
        [--trees main=/work/main/src,this=src]       # each tree's `src` on PYTHONPATH, alternately
    python benchmarks/decode_loop_speed.py --profile kv [--steps 200]   # cProfile, by layer
    python benchmarks/decode_loop_speed.py --misses xt      # CPU per op in the meta cache's misses

Jobs (each a small 2-layer transformer sampling `--steps` tokens under `torch.no_grad()` on
"cuda", estimated in process with `peakmem.estimate(job, gpu="h200", steps="all")`; the
loop's own CPU seconds are timed, `time.process_time`, inside the capture):

- `crop`: nanoGPT / minGPT / makemore's `generate` / `sample`: the whole (cropped) context
  through the model every step, `logits[:, -1, :] / temperature`, the top-k cut
  (`logits[logits < v[:, [-1]]] = -inf`), softmax, `multinomial`, `cat` (64 wide, 4 heads,
  block 32: the shapes repeat once the context is cropped).
- `kv`: a key/value-cache decode (Hugging Face's `generate` style): one new token per step, its
  keys and values concatenated onto the cache (every step new shapes), top-k filtering.
- `xt`: x-transformers' `AutoregressiveWrapper.generate(..., cache_kv=True)` (64 wide, 4 heads,
  rotary positions), as train_enwik8.py samples (skipped where x-transformers is missing).

Each (job, tree) runs in a fresh child process (a cold meta cache, as `peakmem estimate`'s
child has) with that tree's `src` first on PYTHONPATH; rounds alternate the trees, as the load
on a shared machine varies. A child prints one JSON line: the loop's CPU seconds, its aten ops
(counted in a second, untimed estimate of the same job), and the estimate's peak bytes and
digests of its trace and utilization record (`speed_regression.py`'s), so the trees'
estimates are compared too (the last table column: `same` where every tree agrees).
`--profile JOB` runs the job once in this process under cProfile and prints the loop's own
time by layer (the builtins' time charged to their callers): the torch-function modes,
the recorder, the meta cache and meta kernels, allocation bookkeeping, the utilization
observer, phases and module hooks, the job's own code.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOBS = ("crop", "kv", "xt")


# the jobs ---------------------------------------------------------------------------------------

def _gpt_classes():
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, width: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln_1 = nn.LayerNorm(width)
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.ln_2 = nn.LayerNorm(width)
            self.c_fc = nn.Linear(width, 4 * width)
            self.mlp_proj = nn.Linear(4 * width, width)

        def forward(self, x, cache=None):
            batch, length, width = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
            q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
                       for t in (q, k, v))
            if cache is not None:  # keys and values of the earlier tokens
                if cache:
                    k = torch.cat((cache[0], k), dim=2)
                    v = torch.cat((cache[1], v), dim=2)
                cache[:] = [k, v]
            y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(batch, length, width))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab: int = 65, block: int = 32, width: int = 64, heads: int = 4,
                     layers: int = 2) -> None:
            super().__init__()
            self.block_size = block
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(block, width)
            self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)
            self.lm_head = nn.Linear(width, vocab, bias=False)

        def forward(self, idx, caches=None, start: int = 0):
            length = idx.size(1)
            pos = torch.arange(start, start + length, dtype=torch.long, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for index, block in enumerate(self.blocks):
                x = block(x, None if caches is None else caches[index])
            return self.lm_head(self.ln_f(x))

    return GPT


def crop_job(steps: int) -> float:
    """nanoGPT's `generate` (temperature 0.8, top_k 10): the cropped context through the model
    every step."""
    import torch
    from torch.nn import functional as F

    model = _gpt_classes()(block=32).cuda().eval()
    idx = torch.zeros((1, 1), dtype=torch.long, device="cuda")
    start = time.process_time()
    with torch.no_grad():
        for _ in range(steps):
            cond = idx if idx.size(1) <= model.block_size else idx[:, -model.block_size:]
            logits = model(cond)[:, -1, :] / 0.8  # temperature
            top, _ = torch.topk(logits, 10)
            logits[logits < top[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
    return time.process_time() - start


def kv_job(steps: int) -> float:
    """A key/value-cache decode: one token a step, the cache grows, top-k sampling."""
    import torch
    from torch.nn import functional as F

    model = _gpt_classes()(block=steps + 8).cuda().eval()
    caches: list[list] = [[] for _ in model.blocks]
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], device="cuda")
    start = time.process_time()
    with torch.no_grad():
        logits = model(prompt, caches)[:, -1, :]
        out = [prompt]
        for step in range(steps):
            top, _ = torch.topk(logits, 10)
            logits = logits.masked_fill(logits < top[:, [-1]], float("-inf"))
            token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            out.append(token)
            logits = model(token, caches, start=prompt.size(1) + step)[:, -1, :]
        torch.cat(out, dim=1)
    return time.process_time() - start


def xt_job(steps: int) -> float:
    """x-transformers' generate with a key/value cache, as train_enwik8.py samples."""
    import torch
    from x_transformers import Decoder, TransformerWrapper
    from x_transformers.autoregressive_wrapper import AutoregressiveWrapper

    model = AutoregressiveWrapper(TransformerWrapper(
        num_tokens=256, max_seq_len=1024,
        attn_layers=Decoder(dim=64, depth=2, heads=4, rotary_pos_emb=True))).cuda().eval()
    prompt = torch.arange(64).cuda()
    start = time.process_time()
    model.generate(prompts=prompt, seq_len=steps, cache_kv=True)
    return time.process_time() - start


def _job(name: str):
    return {"crop": crop_job, "kv": kv_job, "xt": xt_job}[name]


def _available(name: str) -> bool:
    if name != "xt":
        return True
    try:
        import x_transformers  # noqa: F401
    except ImportError:
        return False
    return True


# one tree, in a child -----------------------------------------------------------------------------

def _estimate(job, steps: int, seconds: list):
    from peakmem.estimate import estimate

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        return estimate(lambda: seconds.append(job(steps)), gpu="h200", steps="all")


def child(name: str, steps: int) -> dict:
    sys.path.insert(0, str(HERE))
    from speed_regression import trace_digest, utilization_digest

    from peakmem.capture import recorder

    job = _job(name)
    seconds: list[float] = []
    estimate = _estimate(job, steps, seconds)
    figures = {
        "seconds": seconds[0],
        "peak_bytes": estimate.peak_bytes,
        "trace": trace_digest(estimate.capture.trace),
        "utilization": utilization_digest(estimate),
    }
    # the loop's aten ops, counted in a second (untimed) estimate
    counting = [False, 0]
    original = recorder.AllocationRecorder._dispatch

    def counted(self, func, args, kwargs):
        if counting[0]:
            counting[1] += 1
        return original(self, func, args, kwargs)

    def counting_job(count_steps: int) -> float:
        counting[0] = True
        try:
            return job(count_steps)
        finally:
            counting[0] = False

    recorder.AllocationRecorder._dispatch = counted
    try:
        _estimate(counting_job, steps, [])
    finally:
        recorder.AllocationRecorder._dispatch = original
    figures["ops"] = counting[1]
    return figures


def run_child(tree: str, name: str, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", name, "--steps", str(steps)],
        env=env, capture_output=True, text=True, check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{name} on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


# cProfile by layer ---------------------------------------------------------------------------------

LAYERS = (
    ("meta kernels (torch refs, prims, decompositions)",
     ("torch/_refs", "torch/_prims", "torch/_decomp", "torch/_meta_registrations",
      "symbolic_shapes", "torch/_library", "torch/_ops.py", "torch/_compile", "eval_frame",
      "torch/__init__.py", "capture/fast_layouts")),
    ("meta cache", ("capture/meta_cache",)),
    ("recorder", ("capture/recorder", "capture/subclass_storages", "capture/in_place_branches")),
    ("torch-function modes", ("capture/capture_modes", "capture/device_map",
                              "capture/host_deferred", "capture/known_values",
                              "capture/arg_tensors", "capture/tensor_overrides",
                              "capture/slice_bounds", "capture/device_specs",
                              "capture/einsum_path", "capture/host_values",
                              "cuda_rules/true_device", "torch/overrides")),
    ("allocation bookkeeping", ("capture/session", "trace/", "capture/fake_memory")),
    ("utilization observer", ("utilization/",)),
    ("phases, module hooks", ("capture/phases", "capture/weight_copies", "capture/modules",
                              "torch/nn/modules/module.py")),
    ("CUDA rules", ("cuda_rules/", "capture/runner")),
)


def _layer(path: str, name: str) -> str:
    where = f"{path}:{name}"
    for layer, parts in LAYERS:
        if any(part in where for part in parts):
            return layer
    if "decode_loop_speed" in path or "x_transformers" in path or "torch/nn/" in path \
            or "einops" in path:
        return "the job's own code (model, sampling)"
    return "other"


def profile(name: str, steps: int) -> None:
    job = _job(name)
    profiler = cProfile.Profile(time.process_time)

    def profiled(count: int) -> float:
        profiler.enable()
        try:
            return job(count)
        finally:
            profiler.disable()

    seconds: list[float] = []
    _estimate(profiled, steps, seconds)
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    by_layer: collections.Counter = collections.Counter()
    others: collections.Counter = collections.Counter()

    def charge(path: str, func: str, own: float) -> None:
        layer = _layer(path, func)
        by_layer[layer] += own
        if layer == "other":
            others[f"{path.rsplit('/', 1)[-1]}:{func}"] += own

    for (path, _line, func), (_cc, _nc, own, _ct, callers) in stats.items():
        if path == "~" and callers:  # a builtin: its time charged to its callers
            share = sum(value[2] for value in callers.values()) or 1.0
            for (caller_path, _l, caller), value in callers.items():
                charge(caller_path, caller, own * value[2] / share)
        else:
            charge(path, func, own)
    total = sum(by_layer.values())
    print(f"{name}: {steps} steps, {seconds[0]:.2f} CPU s under cProfile; own time by layer")
    for layer, own in by_layer.most_common():
        print(f"  {own:7.2f} s {own / total * 100:5.1f}%  {layer}")
    print("  other, the largest: " + ", ".join(
        f"{where} {own:.2f} s" for where, own in others.most_common(6)))


# the meta cache's misses ----------------------------------------------------------------------------

def misses(name: str, steps: int, top: int = 12) -> None:
    """The job once in this process (a cold meta cache): CPU per op in the meta cache's misses
    (the op's meta kernel, or a fast_layouts rule) and in its other calls (hits, uncached)."""
    from peakmem.capture import meta_cache

    cost: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0, 0.0])
    original = meta_cache.MetaCache.call_entry

    def timed(self, func, args, kwargs):
        before = self.misses
        start = time.process_time()
        try:
            return original(self, func, args, kwargs)
        finally:
            spent = time.process_time() - start
            row = cost[str(func)]
            if self.misses > before:
                row[0] += 1
                row[1] += spent
            else:
                row[2] += 1
                row[3] += spent

    meta_cache.MetaCache.call_entry = timed
    seconds: list[float] = []
    try:
        _estimate(_job(name), steps, seconds)
    finally:
        meta_cache.MetaCache.call_entry = original
    missed = sum(row[1] for row in cost.values())
    other = sum(row[3] for row in cost.values())
    print(f"{name}: {steps} steps, {seconds[0]:.2f} CPU s; misses {missed:.2f} s "
          f"({sum(row[0] for row in cost.values())}), other calls {other:.2f} s "
          f"({sum(row[2] for row in cost.values())})")
    print(f"{'op':48} {'misses':>6} {'ms':>7} {'us each':>8} {'others':>7} {'ms':>7}")
    for op, (count, spent, others, other_spent) in sorted(
            cost.items(), key=lambda item: -item[1][1])[:top]:
        print(f"{op:48} {count:6d} {spent * 1e3:7.1f} {spent / max(count, 1) * 1e6:8.0f} "
              f"{others:7d} {other_spent * 1e3:7.1f}")


# the parent ---------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trees", default=f"this={HERE.parent / 'src'}",
                        help="NAME=SRC_DIR,... (alternated each round)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", default=None, metavar="JOB")
    parser.add_argument("--misses", default=None, metavar="JOB",
                        help="CPU per op in the meta cache's misses and other calls")
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.steps)))
        return 0
    if args.profile is not None:
        profile(args.profile, args.steps)
        return 0
    if args.misses is not None:
        misses(args.misses, args.steps)
        return 0
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    names = [name for name in args.jobs.split(",") if _available(name)]
    results: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for round_index in range(args.rounds):
        order = list(trees.items())
        if round_index % 2:
            order.reverse()
        for name in names:
            for tree_name, tree in order:
                figures = run_child(tree, name, args.steps)
                results[(name, tree_name)].append(figures)
                print(f"# round {round_index + 1} {name} {tree_name}: {figures['seconds']:.2f} s, "
                      f"{figures['ops']} ops", file=sys.stderr)
    print(f"| job | tree | CPU s per {args.steps} steps (each round) | ms per op (median) "
          "| aten ops | estimate |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names:
        digests = {(r["peak_bytes"], r["trace"], r["utilization"])
                   for tree_name in trees for r in results[(name, tree_name)]}
        same = "same" if len(digests) == 1 else "DIFFERS"
        for tree_name in trees:
            runs = results[(name, tree_name)]
            seconds = [r["seconds"] for r in runs]
            ops = runs[0]["ops"]
            per_op = statistics.median(seconds) / ops * 1e3
            print(f"| {name} | {tree_name} | {' / '.join(f'{s:.2f}' for s in seconds)} "
                  f"| {per_op:.3f} | {ops} | {same} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
