# ruff: noqa: F403, F405, E401, E701, E702, I001  (kept as the original script writes it)
"""fastai's nbs/examples/migrating_fastai.py ("Pure PyTorch to fastai"): pytorch/examples'
MNIST Net as an nn.Sequential, torchvision MNIST DataLoaders (batch 256, test 512,
`num_workers=1, pin_memory=True`) wrapped in fastai `DataLoaders(...).cuda()`, a `Learner` with
`loss_func=F.nll_loss`, fastai's own `Adam` optimizer (`opt_func`, not torch.optim) and the
`accuracy` metric, trained with `fit_one_cycle(epochs, lr)`: fastai's callbacks (Recorder,
ProgressCallback, ParamScheduler) around the loop and a validation pass each epoch.

The example imports `fastai2.vision.all` (fastai v2's name before its release); the package
is `fastai` now. `datasets.MNIST('../data', download=True)` downloads nothing when the raw
idx files are there: the test writes a small synthetic MNIST in ../data/MNIST/raw.

To run: python migrating_fastai.py
"""
from fastai.vision.all import *
from torchvision import datasets, transforms

class Net(nn.Sequential):
    def __init__(self):
        super().__init__(
            nn.Conv2d(1, 32, 3, 1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, 1), nn.MaxPool2d(2), nn.Dropout2d(0.25),
            Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout2d(0.5),
            nn.Linear(128, 10), nn.LogSoftmax(dim=1) )

batch_size,test_batch_size = 256,512
epochs,lr = 1,1e-2

kwargs = {'num_workers': 1, 'pin_memory': True}
transform=transforms.Compose([transforms.ToTensor(),
                              transforms.Normalize((0.1307,), (0.3081,))])
train_loader = DataLoader(
    datasets.MNIST('../data', train=True, download=True, transform=transform),
                   batch_size=batch_size, shuffle=True, **kwargs)
test_loader = DataLoader(
    datasets.MNIST('../data', train=False, transform=transform),
                   batch_size=test_batch_size, shuffle=True, **kwargs)

if __name__ == '__main__':
    data = DataLoaders(train_loader, test_loader).cuda()
    learn = Learner(data, Net(), loss_func=F.nll_loss, opt_func=Adam, metrics=accuracy)
    learn.fit_one_cycle(epochs, lr)
