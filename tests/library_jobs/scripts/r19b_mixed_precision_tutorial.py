# ruff: noqa
"""Re-creation of pytorch/tutorials `intermediate_source/mixed_precision_tutorial.py` (the
`torch.cuda.amp` version, 1122d9b), in its structure and idioms: 128 input / target batches
made on the device up front as two Python lists, a 6-layer Linear/ReLU `Sequential` (`.cuda()`)
trained with SGD over `zip(data, targets)` for 3 epochs in five sections (default precision,
`torch.cuda.amp.autocast()` with dtype asserts, then `torch.cuda.amp.GradScaler`, a second net
and optimizer "all together", and `scaler.unscale_` + `clip_grad_norm_`), timed between
`gc.collect()`, `torch.cuda.empty_cache()`, `torch.cuda.reset_max_memory_allocated()`,
`torch.cuda.synchronize()` and a print of `torch.cuda.max_memory_allocated()`.
"""

import time, gc

_start_time = None

def start_timer():
    global _start_time
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_max_memory_allocated()
    torch.cuda.synchronize()
    _start_time = time.time()

def end_timer_and_print(local_msg):
    torch.cuda.synchronize()
    print(local_msg)
    print("Total execution time = {:.3f} sec".format(time.time() - _start_time))
    print("Max memory used by tensors = {} bytes".format(torch.cuda.max_memory_allocated()))

def make_model(in_size, out_size, num_layers):
    layers = []
    for _ in range(num_layers - 1):
        layers.append(torch.nn.Linear(in_size, in_size))
        layers.append(torch.nn.ReLU())
    layers.append(torch.nn.Linear(in_size, out_size))
    return torch.nn.Sequential(*tuple(layers)).cuda()

######################################################################
# Without torch.cuda.amp, the following simple "network" executes all
# ops in default precision (torch.float32):

import torch

batch_size = 256 # Try, for example, 32, 33
in_size = 4096
out_size = 4096
num_layers = 6
num_batches = 128
epochs = 3

data = [torch.randn(batch_size, in_size, device="cuda") for _ in range(num_batches)]
targets = [torch.randn(batch_size, out_size, device="cuda") for _ in range(num_batches)]
loss_fn = torch.nn.MSELoss().cuda()

net = make_model(in_size, out_size, num_layers)
opt = torch.optim.SGD(net.parameters(), lr=0.001)

start_timer()
for epoch in range(epochs):
    for input, target in zip(data, targets):
        output = net(input)
        loss = loss_fn(output, target)
        loss.backward()
        opt.step()
        opt.zero_grad() # set_to_none=True here can modestly improve performance
end_timer_and_print("With default precision:")

######################################################################
# Adding autocast
# ---------------
for epoch in range(epochs):
    for input, target in zip(data, targets):
        # Runs the forward pass under autocast
        with torch.cuda.amp.autocast():
            output = net(input)
            # Linear layers with float32 inputs autocast to float16
            assert output.dtype is torch.float16

            loss = loss_fn(output, target)
            # mse_loss layers with float16 inputs autocast to float32
            assert loss.dtype is torch.float32

        # Exits autocast before backward().
        loss.backward()
        opt.step()
        opt.zero_grad() # set_to_none=True here can modestly improve performance

######################################################################
# Adding GradScaler
# -----------------
scaler = torch.cuda.amp.GradScaler()

for epoch in range(epochs):
    for input, target in zip(data, targets):
        with torch.cuda.amp.autocast():
            output = net(input)
            loss = loss_fn(output, target)

        # Scales loss.  Calls backward() on scaled loss to create scaled gradients.
        scaler.scale(loss).backward()

        # scaler.step() first unscales the gradients of the optimizer's assigned params.
        scaler.step(opt)

        # Updates the scale for next iteration.
        scaler.update()

        opt.zero_grad()

######################################################################
# All together
# ------------

net = make_model(in_size, out_size, num_layers)
opt = torch.optim.SGD(net.parameters(), lr=0.001)
scaler = torch.cuda.amp.GradScaler()

start_timer()
for epoch in range(epochs):
    for input, target in zip(data, targets):
        with torch.cuda.amp.autocast():
            output = net(input)
            loss = loss_fn(output, target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
end_timer_and_print("With mixed precision:")

######################################################################
# Inspecting/modifying gradients (e.g., gradient clipping)
# ---------------
for epoch in range(epochs):
    for input, target in zip(data, targets):
        with torch.cuda.amp.autocast():
            output = net(input)
            loss = loss_fn(output, target)
        scaler.scale(loss).backward()

        # Unscales the gradients of optimizer's assigned params in-place
        scaler.unscale_(opt)

        # Since the gradients of optimizer's assigned params are now unscaled, clips as usual.
        torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=0.1)

        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
