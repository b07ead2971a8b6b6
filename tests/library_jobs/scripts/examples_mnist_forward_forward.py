# ruff: noqa: B007  (kept as the original script writes it)
"""pytorch/examples mnist_forward_forward/main.py style: Hinton's forward-forward algorithm,
each Layer (an nn.Linear subclass) with its own Adam, trained layer by layer for many epochs on
the whole (positive, negative) data set, no backward through the network."""

import argparse
import time

import torch
import torch.nn as nn
from torch.optim import Adam


def overlay_y_on_x(x, y, classes=10):
    x_ = x.clone()
    x_[:, :classes] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Net(torch.nn.Module):
    def __init__(self, dims, lr, threshold, epochs, device):
        super().__init__()
        self.layers = []
        for d in range(len(dims) - 1):
            self.layers = self.layers + [Layer(dims[d], dims[d + 1], lr, threshold, epochs).to(device)]

    def predict(self, x):
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, label)
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness = goodness + [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        goodness_per_label = torch.cat(goodness_per_label, 1)
        return goodness_per_label.argmax(1)

    def train(self, x_pos, x_neg):
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print("training layer: ", i)
            h_pos, h_neg = layer.train(h_pos, h_neg)


class Layer(nn.Linear):
    def __init__(self, in_features, out_features, lr, threshold, epochs, bias=True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.relu = torch.nn.ReLU()
        self.opt = Adam(self.parameters(), lr=lr)
        self.threshold = threshold
        self.num_epochs = epochs

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos, x_neg):
        for i in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if i % args.log_interval == 0:
                print("Loss: ", loss.item())
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1000, metavar="N")
    parser.add_argument("--lr", type=float, default=0.03, metavar="LR")
    parser.add_argument("--no_cuda", action="store_true", default=False)
    parser.add_argument("--no_mps", action="store_true", default=False)
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--save_model", action="store_true", default=False)
    parser.add_argument("--train_size", type=int, default=50000)
    parser.add_argument("--threshold", type=float, default=2)
    parser.add_argument("--test_size", type=int, default=10000)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    use_mps = not args.no_mps and torch.backends.mps.is_available()
    if use_cuda:
        device = torch.device("cuda")
    elif use_mps:
        device = torch.device("mps")
    else:
        device = torch.device("cpu")
    torch.manual_seed(args.seed)
    # the MNIST loaders with batch_size=train_size: one batch, the whole set, flattened
    x = torch.rand(args.train_size, 784).to(device)
    y = torch.randint(0, 10, (args.train_size,)).to(device)
    net = Net([784, 500, 500], args.lr, args.threshold, args.epochs, device)
    x_pos = overlay_y_on_x(x, y)
    rnd = torch.randperm(x.size(0))
    x_neg = overlay_y_on_x(x, y[rnd])
    start = time.time()
    net.train(x_pos, x_neg)
    print("train time:", time.time() - start)
    print("train error:", 1.0 - net.predict(x).eq(y).float().mean().item())
    x_te = torch.rand(args.test_size, 784).to(device)
    y_te = torch.randint(0, 10, (args.test_size,)).to(device)
    print("test error:", 1.0 - net.predict(x_te).eq(y_te).float().mean().item())
    if args.save_model:
        torch.save(net.state_dict(), "mnist_ff.pt")
