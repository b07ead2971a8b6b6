"""pytorch/tutorials intermediate_source/optimizer_step_in_backward_tutorial.py, re-created: a
torchvision ViT-L/16 with its default (ImageNet) weights, 3 train steps with one Adam under
`torch.cuda.memory._record_memory_history(enabled='all')` and a pickled `_snapshot()`, then
`del optimizer`, one `Adam([p], foreach=False)` per parameter stepped from
`register_post_accumulate_grad_hook` (the optimizer step fused into the backward, gradients
freed as they are made) and 3 more steps recorded the same way. The tutorial's own figures
(H100 snapshots): a ~6 GB peak in the first phase (1.2 GB parameters, 1.2 GB gradients,
2.4 GB Adam state, 1.2 GB foreach intermediates), ~4 GB in the second."""

from pickle import dump

import torch
from torchvision import models

model = models.vit_l_16(weights='DEFAULT').cuda()
optimizer = torch.optim.Adam(model.parameters())

IMAGE_SIZE = 224


def train(model, optimizer):
    # create our fake image input: tensor shape is batch_size, channels, height, width
    fake_image = torch.rand(1, 3, IMAGE_SIZE, IMAGE_SIZE).cuda()

    # call our forward and backward
    loss = model.forward(fake_image)
    loss.sum().backward()

    # optimizer update
    optimizer.step()
    optimizer.zero_grad()


# tell CUDA to start recording memory allocations
torch.cuda.memory._record_memory_history(enabled='all')

# train 3 steps
for _ in range(3):
    train(model, optimizer)

# save a snapshot of the memory allocations
s = torch.cuda.memory._snapshot()
with open("snapshot.pickle", "wb") as f:
    dump(s, f)

# tell CUDA to stop recording memory allocations now
torch.cuda.memory._record_memory_history(enabled=None)

# Instead of having just *one* optimizer, we will have a ``dict`` of optimizers
# for every parameter so we could reference them in our hook.
optimizer_dict = {p: torch.optim.Adam([p], foreach=False) for p in model.parameters()}


# Define our hook, which will call the optimizer ``step()`` and ``zero_grad()``
def optimizer_hook(parameter) -> None:
    optimizer_dict[parameter].step()
    optimizer_dict[parameter].zero_grad()


# Register the hook onto every parameter
for p in model.parameters():
    p.register_post_accumulate_grad_hook(optimizer_hook)


# Now remember our previous ``train()`` function? Since the optimizer has been
# fused into the backward, we can remove the optimizer step and zero_grad calls.
def train(model):
    # create our fake image input: tensor shape is batch_size, channels, height, width
    fake_image = torch.rand(1, 3, IMAGE_SIZE, IMAGE_SIZE).cuda()

    # call our forward and backward
    loss = model.forward(fake_image)
    loss.sum().backward()

    # optimizer update --> no longer needed!
    # optimizer.step()
    # optimizer.zero_grad()


# delete optimizer memory from before to get a clean slate for the next
# memory snapshot
del optimizer

# tell CUDA to start recording memory allocations
torch.cuda.memory._record_memory_history(enabled='all')

# train 3 steps. note that we no longer pass the optimizer into train()
for _ in range(3):
    train(model)

# save a snapshot of the memory allocations
s = torch.cuda.memory._snapshot()
with open("snapshot-opt-in-bwd.pickle", "wb") as f:
    dump(s, f)

# tell CUDA to stop recording memory allocations now
torch.cuda.memory._record_memory_history(enabled=None)
