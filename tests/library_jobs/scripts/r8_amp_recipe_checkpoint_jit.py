"""pytorch/tutorials recipes_source/recipes/amp_recipe.py: `make_model` (Linear + ReLU layers,
the last Linear alone), lists of device batches, MSELoss, SGD, `torch.autocast(device_type,
dtype)` around the forward and loss, `torch.amp.GradScaler("cuda", enabled=use_amp)`
(scale / step / update, `zero_grad(set_to_none=True)`), with the recipe's options around it:
`--dtype bfloat16` (no scaler needed), activation checkpointing of each hidden layer with
`torch.utils.checkpoint.checkpoint(..., use_reentrant=True|False)` (the
intermediate_source/checkpoint tutorial's pattern), and the model compiled with
`torch.jit.script` (a TorchScript module trained as is)."""

import argparse

import torch
from torch.utils.checkpoint import checkpoint


class Net(torch.nn.Module):
    """amp_recipe's make_model as a module, so its hidden layers can be checkpointed."""

    def __init__(self, in_size, out_size, num_layers, ckpt_mode: str):
        super().__init__()
        layers = []
        for _ in range(num_layers - 1):
            layers.append(torch.nn.Sequential(torch.nn.Linear(in_size, in_size), torch.nn.ReLU()))
        self.hidden = torch.nn.ModuleList(layers)
        self.out = torch.nn.Linear(in_size, out_size)
        self.ckpt_mode = ckpt_mode

    def forward(self, x):
        for layer in self.hidden:
            if self.ckpt_mode == "none":
                x = layer(x)
            else:
                x = checkpoint(layer, x, use_reentrant=self.ckpt_mode == "reentrant")
        return self.out(x)


class ScriptNet(torch.nn.Module):
    """The same layers, written for torch.jit.script (no checkpointing inside TorchScript)."""

    def __init__(self, in_size: int, out_size: int, num_layers: int):
        super().__init__()
        self.hidden = torch.nn.ModuleList(
            [torch.nn.Linear(in_size, in_size) for _ in range(num_layers - 1)])
        self.out = torch.nn.Linear(in_size, out_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.out(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--in-size", type=int, default=1024)
    parser.add_argument("--out-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=6)
    parser.add_argument("--num-batches", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--checkpoint", default="none",
                        choices=["none", "reentrant", "non-reentrant"])
    parser.add_argument("--jit", action="store_true")
    args = parser.parse_args()

    device = "cuda"
    use_amp = args.dtype != "float32"
    dtype = getattr(torch, args.dtype)
    # Creates data in default precision; the same data is used for both default and mixed
    # precision trials below
    data = [torch.randn(args.batch_size, args.in_size, device=device)
            for _ in range(args.num_batches)]
    targets = [torch.randn(args.batch_size, args.out_size, device=device)
               for _ in range(args.num_batches)]
    loss_fn = torch.nn.MSELoss().cuda()

    if args.jit:
        net = torch.jit.script(ScriptNet(args.in_size, args.out_size, args.num_layers).cuda())
    else:
        net = Net(args.in_size, args.out_size, args.num_layers, args.checkpoint).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.001)
    # float16 gradients need scaling; bfloat16 has float32's range
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and dtype == torch.float16)

    for epoch in range(args.epochs):
        for input, target in zip(data, targets):  # noqa: B905  (as the recipe writes it)
            with torch.autocast(device_type=device, dtype=dtype, enabled=use_amp):
                output = net(input)
                assert output.dtype is (dtype if use_amp else torch.float32)
                loss = loss_fn(output, target)
                assert loss.dtype is torch.float32  # mse_loss autocasts to float32
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        print(f"epoch {epoch} loss {loss.item():.4f} scale {scaler.get_scale() if scaler.is_enabled() else 1.0}")


if __name__ == "__main__":
    main()
