# ruff: noqa: UP008, UP031  (kept as the original script writes it)
"""DeepSpeedExamples training/cifar/cifar10_deepspeed.py, re-created: run as
`deepspeed cifar10_deepspeed.py --deepspeed --deepspeed_config ds_config.json`;
`deepspeed.init_distributed()` at import, rank-0-first barriers around the dataset,
`deepspeed.add_config_arguments`, `deepspeed.initialize(args=..., model=net,
model_parameters=filter(requires_grad), training_data=trainset)` (the engine builds the
optimizer from the config: "Adam" is DeepSpeed's FusedAdam on CUDA, and the DataLoader),
`model_engine.backward / step`, `loss.item()` logging, then the test loop through the bare
`net` under no_grad.

Changes for an offline test: CIFAR-10 (torchvision's download) is a TensorDataset of random
images of the same shape, --train-size / --test-size long; the matplotlib `imshow` of a batch
is left out.
"""

import argparse

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator


def add_argument():

    parser = argparse.ArgumentParser(description='CIFAR')
    parser.add_argument('--with_cuda', default=False, action='store_true',
                        help='use CPU in case there\'s no GPU support')
    parser.add_argument('--use_ema', default=False, action='store_true',
                        help='whether use exponential moving average')
    parser.add_argument('-b', '--batch_size', default=32, type=int, help='mini-batch size (default: 32)')
    parser.add_argument('-e', '--epochs', default=30, type=int, help='number of total epochs (default: 30)')
    parser.add_argument('--local_rank', type=int, default=-1, help='local rank passed from distributed launcher')
    parser.add_argument('--log-interval', type=int, default=2000,
                        help="output logging information at a given interval")
    parser.add_argument('--train-size', type=int, default=50000)
    parser.add_argument('--test-size', type=int, default=10000)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    return args


deepspeed.init_distributed()
args = add_argument()

if torch.distributed.get_rank() != 0:
    # might be downloading cifar data, let rank 0 download first
    torch.distributed.barrier()

generator = torch.Generator().manual_seed(0)
trainset = torch.utils.data.TensorDataset(torch.rand(args.train_size, 3, 32, 32, generator=generator) * 2 - 1,
                                          torch.randint(0, 10, (args.train_size,), generator=generator))

if torch.distributed.get_rank() == 0:
    # cifar data is downloaded, indicate other ranks can proceed
    torch.distributed.barrier()

testset = torch.utils.data.TensorDataset(torch.rand(args.test_size, 3, 32, 32, generator=generator) * 2 - 1,
                                         torch.randint(0, 10, (args.test_size,), generator=generator))
testloader = torch.utils.data.DataLoader(testset, batch_size=4, shuffle=False, num_workers=2)

classes = ('plane', 'car', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck')

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


net = Net()

parameters = filter(lambda p: p.requires_grad, net.parameters())

model_engine, optimizer, trainloader, __ = deepspeed.initialize(
    args=args, model=net, model_parameters=parameters, training_data=trainset)

local_device = get_accelerator().device_name(model_engine.local_rank)
local_rank = model_engine.local_rank

fp16 = model_engine.fp16_enabled()
bf16 = model_engine.bfloat16_enabled()
print(f'fp16={fp16} bf16={bf16} optimizer={type(model_engine.optimizer).__name__}')
target_dtype = torch.half if fp16 else torch.bfloat16 if bf16 else None

criterion = nn.CrossEntropyLoss()

for epoch in range(2):  # loop over the dataset multiple times

    running_loss = 0.0
    for i, data in enumerate(trainloader):
        inputs, labels = data[0].to(local_device), data[1].to(local_device)
        if target_dtype is not None:
            inputs = inputs.to(target_dtype)
        outputs = model_engine(inputs)
        loss = criterion(outputs, labels)

        model_engine.backward(loss)
        model_engine.step()

        running_loss += loss.item()
        if local_rank == 0 and i % args.log_interval == (args.log_interval - 1):
            print('[%d, %5d] loss: %.3f' % (epoch + 1, i + 1, running_loss / args.log_interval))
            running_loss = 0.0

print('Finished Training')

correct = 0
total = 0
with torch.no_grad():
    for data in testloader:
        images, labels = data
        if target_dtype is not None:
            images = images.to(target_dtype)
        outputs = net(images.to(local_device))
        _, predicted = torch.max(outputs.data, 1)
        total += labels.size(0)
        correct += (predicted == labels.to(local_device)).sum().item()

print('Accuracy of the network on the %d test images: %d %%' % (total, 100 * correct / total))
