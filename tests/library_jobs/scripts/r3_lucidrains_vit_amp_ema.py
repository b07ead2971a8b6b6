"""lucidrains/vit-pytorch style: the ViT of vit_pytorch/vit.py (einops Rearrange patch embedding,
pre-norm Attention with one bias-free `to_qkv`, FeedForward, a cls token and a LayerNorm +
Linear head), trained the way its users write the loop: `torch.amp.GradScaler("cuda")` with
`torch.autocast("cuda", dtype=torch.float16)`, activation checkpointing of each layer
(`torch.utils.checkpoint`, use_reentrant=False), `scaler.unscale_` then `clip_grad_norm_`, an
EMA of the weights through `torch.optim.swa_utils.AveragedModel(get_ema_multi_avg_fn)`,
`torch.compile` of the model (--compile), a validation pass of the EMA model each epoch, and a
checkpoint of model / EMA / optimizer / scaler state."""

import argparse

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset


def pair(t):
    return t if isinstance(t, tuple) else (t, t)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, dropout=0.):
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(dim),
            nn.Linear(dim, hidden_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64, dropout=0.):
        super().__init__()
        inner_dim = dim_head * heads
        project_out = not (heads == 1 and dim_head == dim)
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = nn.Sequential(
            nn.Linear(inner_dim, dim),
            nn.Dropout(dropout),
        ) if project_out else nn.Identity()

    def forward(self, x):
        x = self.norm(x)
        qkv = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> b h n d', h=self.heads), qkv)
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = self.attend(dots)
        attn = self.dropout(attn)
        out = torch.matmul(attn, v)
        out = rearrange(out, 'b h n d -> b n (h d)')
        return self.to_out(out)


class Transformer(nn.Module):
    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., grad_checkpointing=False):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([])
        self.grad_checkpointing = grad_checkpointing
        for _ in range(depth):
            self.layers.append(nn.ModuleList([
                Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout),
                FeedForward(dim, mlp_dim, dropout=dropout),
            ]))

    def _layer(self, x, attn, ff):
        x = attn(x) + x
        return ff(x) + x

    def forward(self, x):
        for attn, ff in self.layers:
            if self.grad_checkpointing and self.training:
                x = checkpoint(self._layer, x, attn, ff, use_reentrant=False)
            else:
                x = self._layer(x, attn, ff)
        return self.norm(x)


class ViT(nn.Module):
    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
                 pool='cls', channels=3, dim_head=64, dropout=0., emb_dropout=0.,
                 grad_checkpointing=False):
        super().__init__()
        image_height, image_width = pair(image_size)
        patch_height, patch_width = pair(patch_size)
        assert image_height % patch_height == 0 and image_width % patch_width == 0
        num_patches = (image_height // patch_height) * (image_width // patch_width)
        patch_dim = channels * patch_height * patch_width
        self.to_patch_embedding = nn.Sequential(
            Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=patch_height, p2=patch_width),
            nn.LayerNorm(patch_dim),
            nn.Linear(patch_dim, dim),
            nn.LayerNorm(dim),
        )
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, grad_checkpointing)
        self.pool = pool
        self.to_latent = nn.Identity()
        self.mlp_head = nn.Linear(dim, num_classes)

    def forward(self, img):
        x = self.to_patch_embedding(img)
        b, n, _ = x.shape
        cls_tokens = repeat(self.cls_token, '1 1 d -> b 1 d', b=b)
        x = torch.cat((cls_tokens, x), dim=1)
        x += self.pos_embedding[:, :(n + 1)]
        x = self.dropout(x)
        x = self.transformer(x)
        x = x.mean(dim=1) if self.pool == 'mean' else x[:, 0]
        x = self.to_latent(x)
        return self.mlp_head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch-size", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--mlp-dim", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--ema-decay", type=float, default=0.999)
    parser.add_argument("--grad-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--save", default="")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = ViT(image_size=args.image_size, patch_size=args.patch_size, num_classes=10,
                dim=args.dim, depth=args.depth, heads=args.heads, mlp_dim=args.mlp_dim,
                dim_head=args.dim // args.heads, grad_checkpointing=args.grad_checkpointing).to(device)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(args.ema_decay))
    train_model = torch.compile(model) if args.compile else model

    images = torch.randn(args.samples, 3, args.image_size, args.image_size)
    labels = torch.randint(0, 10, (args.samples,))
    train_loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(TensorDataset(images[:64], labels[:64]), batch_size=64)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr,
                                                    total_steps=args.epochs * len(train_loader))
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(args.epochs):
        model.train()
        for step, (x, y) in enumerate(train_loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(train_model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            ema.update_parameters(model)
            if step % 4 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} scale {scaler.get_scale()}")

        ema.eval()
        correct = 0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            for x, y in val_loader:
                correct += (ema(x.to(device)).argmax(-1) == y.to(device)).sum().item()
        print(f"epoch {epoch} ema accuracy {correct / 64:.3f}")

    if args.save:
        torch.save({"model": model.state_dict(), "ema": ema.state_dict(),
                    "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, args.save)


if __name__ == "__main__":
    main()
