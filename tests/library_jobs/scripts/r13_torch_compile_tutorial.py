# ruff: noqa: B023  (kept as the tutorial writes it: lambdas over the loop's `inp`)
"""pytorch/tutorials intermediate_source/torch_compile_tutorial.py, its inference and training
comparisons run as the tutorial runs them: `timed` with CUDA events and
`torch.cuda.synchronize()`, `generate_data(16)` (3 x 128 x 128 images, 1000 classes) made on
the device, `init_model()` building a fresh densenet121, eval with `torch.compile(model,
mode="reduce-overhead")` under `torch.no_grad()`, then `train(mod, data)` (Adam,
`opt.zero_grad(True)`) eager for N_ITERS steps, a second `init_model()` and Adam, and the whole
`train` function compiled with `mode="reduce-overhead"` for N_ITERS more; each comparison ends
with `assert speedup > 1` on the median times.

Changed: densenet121 comes from timm (`pretrained=False`), as torchvision's does not import
with this CPU torch (the same DenseNet-121 layers); `--model` and `--iters` make it smaller
for a test (the tutorial: densenet121, N_ITERS 10)."""

import argparse

import numpy as np
import timm
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="densenet121")
parser.add_argument("--iters", type=int, default=10)
args = parser.parse_args()


# Returns the result of running `fn()` and the time it took for `fn()` to run,
# in seconds. We use CUDA events and synchronization for the most accurate
# measurements.
def timed(fn):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    end.record()
    torch.cuda.synchronize()
    return result, start.elapsed_time(end) / 1000


# Generates random input and targets data for the model, where `b` is
# batch size.
def generate_data(b):
    return (
        torch.randn(b, 3, 128, 128).to(torch.float32).cuda(),
        torch.randint(1000, (b,)).cuda(),
    )


N_ITERS = args.iters


def init_model():
    return timm.create_model(args.model, pretrained=False, num_classes=1000).to(torch.float32).cuda()


model = init_model()

# Reset since we are using a different mode.
import torch._dynamo  # noqa: E402

torch._dynamo.reset()

model_opt = torch.compile(model, mode="reduce-overhead")

inp = generate_data(16)[0]
with torch.no_grad():
    print("eager:", timed(lambda: model(inp))[1])
    print("compile:", timed(lambda: model_opt(inp))[1])

eager_times = []
for i in range(N_ITERS):
    inp = generate_data(16)[0]
    with torch.no_grad():
        _, eager_time = timed(lambda: model(inp))
    eager_times.append(eager_time)
    print(f"eager eval time {i}: {eager_time}")
print("~" * 10)

compile_times = []
for i in range(N_ITERS):
    inp = generate_data(16)[0]
    with torch.no_grad():
        _, compile_time = timed(lambda: model_opt(inp))
    compile_times.append(compile_time)
    print(f"compile eval time {i}: {compile_time}")
print("~" * 10)

eager_med = np.median(eager_times)
compile_med = np.median(compile_times)
speedup = eager_med / compile_med
assert speedup > 1
print(f"(eval) eager median: {eager_med}, compile median: {compile_med}, speedup: {speedup}x")
print("~" * 10)

model = init_model()
opt = torch.optim.Adam(model.parameters())


def train(mod, data):
    opt.zero_grad(True)
    pred = mod(data[0])
    loss = torch.nn.CrossEntropyLoss()(pred, data[1])
    loss.backward()
    opt.step()


eager_times = []
for i in range(N_ITERS):
    inp = generate_data(16)
    _, eager_time = timed(lambda: train(model, inp))
    eager_times.append(eager_time)
    print(f"eager train time {i}: {eager_time}")
print("~" * 10)

model = init_model()
opt = torch.optim.Adam(model.parameters())

# Note that because we are compiling a regular Python function, we do not
# call any .compile() method.
train_opt = torch.compile(train, mode="reduce-overhead")

compile_times = []
for i in range(N_ITERS):
    inp = generate_data(16)
    _, compile_time = timed(lambda: train_opt(model, inp))
    compile_times.append(compile_time)
    print(f"compile train time {i}: {compile_time}")
print("~" * 10)

eager_med = np.median(eager_times)
compile_med = np.median(compile_times)
speedup = eager_med / compile_med
assert speedup > 1
print(f"(train) eager median: {eager_med}, compile median: {compile_med}, speedup: {speedup}x")
print("~" * 10)
