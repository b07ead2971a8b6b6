"""A hand-written GCN (Kipf & Welling; pytorch/examples gcn/main.py style): a Cora-sized
random citation graph (2708 nodes, 1433 binary features, 7 classes) with a symmetric-normalised
sparse adjacency, two GraphConv layers (`torch.sparse.mm(adj, x @ W)`), dropout, Adam with weight
decay, full-batch training with train / val / test masks and early stopping on the val loss."""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="PyTorch Graph Convolutional Network")
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--l2", type=float, default=5e-4)
parser.add_argument("--dropout-p", type=float, default=0.5)
parser.add_argument("--hidden-dim", type=int, default=16)
parser.add_argument("--include-bias", action="store_true", default=False)
parser.add_argument("--no-cuda", action="store_true", default=False)
parser.add_argument("--nodes", type=int, default=2708)
parser.add_argument("--features", type=int, default=1433)
parser.add_argument("--classes", type=int, default=7)
parser.add_argument("--edges", type=int, default=5429)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=10)
args = parser.parse_args()

use_cuda = not args.no_cuda and torch.cuda.is_available()
device = torch.device("cuda" if use_cuda else "cpu")
torch.manual_seed(args.seed)


class GraphConv(nn.Module):
    def __init__(self, input_dim, output_dim, use_bias=False):
        super().__init__()
        self.kernel = nn.Parameter(torch.Tensor(input_dim, output_dim))
        nn.init.xavier_normal_(self.kernel)
        self.bias = None
        if use_bias:
            self.bias = nn.Parameter(torch.Tensor(output_dim))
            nn.init.zeros_(self.bias)

    def forward(self, input_tensor, adj_mat):
        support = torch.mm(input_tensor, self.kernel)
        output = torch.spmm(adj_mat, support)
        if self.bias is not None:
            output = output + self.bias
        return output


class GCN(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, use_bias=True, dropout_p=0.1):
        super().__init__()
        self.gc1 = GraphConv(input_dim, hidden_dim, use_bias=use_bias)
        self.gc2 = GraphConv(hidden_dim, output_dim, use_bias=use_bias)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input_tensor, adj_mat):
        x = self.gc1(input_tensor, adj_mat)
        x = F.relu(x)
        x = self.dropout(x)
        x = self.gc2(x, adj_mat)
        return F.log_softmax(x, dim=1)


def load_cora_like(n, f, c, e):
    features = (torch.rand(n, f) < 0.0127).float()
    features = features / features.sum(1, keepdim=True).clamp(min=1)
    labels = torch.randint(0, c, (n,))
    src = torch.randint(0, n, (e,))
    dst = torch.randint(0, n, (e,))
    index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src]),
                       torch.arange(n).repeat(2, 1)], dim=1)
    values = torch.ones(index.shape[1])
    adj = torch.sparse_coo_tensor(index, values, (n, n)).coalesce()
    deg = torch.sparse.sum(adj, dim=1).to_dense()
    d_inv_sqrt = deg.pow(-0.5)
    row, col = adj.indices()
    adj = torch.sparse_coo_tensor(adj.indices(), d_inv_sqrt[row] * adj.values() * d_inv_sqrt[col], (n, n))
    idx = torch.randperm(n)
    return features, labels, adj, idx[:140], idx[200:500], idx[500:1500]


def train_iter(epoch, model, optimizer, criterion, input, target, mask_train, mask_val, print_every=10):
    start_t = time.time()
    model.train()
    optimizer.zero_grad()
    output = model(*input)
    loss = criterion(output[mask_train], target[mask_train])
    loss.backward()
    optimizer.step()
    loss_train, acc_train = test(model, criterion, input, target, mask_train)
    loss_val, acc_val = test(model, criterion, input, target, mask_val)
    if epoch % print_every == 0:
        print(f"Epoch: {epoch:04d} ({(time.time() - start_t):.4f}s) loss_train: {loss_train:.4f} "
              f"acc_train: {acc_train:.4f} loss_val: {loss_val:.4f} acc_val: {acc_val:.4f}")
    return loss_val


def test(model, criterion, input, target, mask):
    model.eval()
    with torch.no_grad():
        output = model(*input)
        output, target = output[mask], target[mask]
        loss = criterion(output, target)
        acc = (output.argmax(dim=1) == target).float().sum() / len(target)
    return loss.item(), acc.item()


features, labels, adj_mat, idx_train, idx_val, idx_test = load_cora_like(
    args.nodes, args.features, args.classes, args.edges)
features, labels, adj_mat = features.to(device), labels.to(device), adj_mat.to(device)
idx_train, idx_val, idx_test = idx_train.to(device), idx_val.to(device), idx_test.to(device)

gcn = GCN(args.features, args.hidden_dim, args.classes, args.include_bias, args.dropout_p).to(device)
optimizer = torch.optim.Adam(gcn.parameters(), lr=args.lr, weight_decay=args.l2)
criterion = nn.NLLLoss()

best_val, patience = float("inf"), 0
for epoch in range(args.epochs):
    loss_val = train_iter(epoch + 1, gcn, optimizer, criterion, (features, adj_mat), labels,
                          idx_train, idx_val, args.log_interval)
    if loss_val < best_val:
        best_val, patience = loss_val, 0
    else:
        patience += 1
loss_test, acc_test = test(gcn, criterion, (features, adj_mat), labels, idx_test)
print(f"Test set results: loss {loss_test:.4f} accuracy {acc_test:.4f}")
