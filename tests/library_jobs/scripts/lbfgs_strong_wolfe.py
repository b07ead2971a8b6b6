"""A curve fit with `torch.optim.LBFGS(line_search_fn="strong_wolfe")`, as scipy-style fitting
scripts write it: the line search's number of closure calls depends on the loss values, which
fake mode does not compute (a fake-mode limit: `--mode fake` exits 3, auto mode runs it eagerly)."""

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.linspace(-1, 1, 256, device=device).unsqueeze(1)
y = 3 * x ** 3 - x + 0.5
model = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(device)
optimizer = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=20, line_search_fn="strong_wolfe")


def closure():
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


for step in range(5):
    loss = optimizer.step(closure)
    print("step", step, "loss", loss.item())
