"""A ViT written with einops as lucidrains' vit-pytorch writes it: `Rearrange` for the patch
embedding, `einops.rearrange` / `repeat` on device tensors inside attention, `einsum` for the
scores, `Reduce` for mean pooling; config from a YAML file next to the script merged with a CLI
dotlist (`OmegaConf.load` + `OmegaConf.from_dotlist(sys.argv[1:])`)."""

import sys
from pathlib import Path

import torch
import torch.nn as nn
from einops import einsum, rearrange, repeat
from einops.layers.torch import Rearrange, Reduce
from omegaconf import OmegaConf


class Attention(nn.Module):
    def __init__(self, dim, heads, dim_head):
        super().__init__()
        inner = heads * dim_head
        self.heads, self.scale = heads, dim_head ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x):
        x = self.norm(x)
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads)
                   for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = einsum(q, k, "b h i d, b h j d -> b h i j") * self.scale
        out = einsum(dots.softmax(dim=-1), v, "b h i j, b h j d -> b h i d")
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))


class ViT(nn.Module):
    def __init__(self, image_size, patch_size, num_classes, dim, depth, heads, dim_head, mlp_dim):
        super().__init__()
        patches = (image_size // patch_size) ** 2
        self.to_patch_embedding = nn.Sequential(
            Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_size, p2=patch_size),
            nn.LayerNorm(3 * patch_size ** 2),
            nn.Linear(3 * patch_size ** 2, dim),
        )
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, patches + 1, dim))
        self.layers = nn.ModuleList(
            nn.ModuleList([Attention(dim, heads, dim_head),
                           nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, mlp_dim), nn.GELU(),
                                         nn.Linear(mlp_dim, dim))])
            for _ in range(depth))
        self.pool = Reduce("b n d -> b d", "mean")
        self.head = nn.Linear(dim, num_classes)

    def forward(self, img):
        x = self.to_patch_embedding(img)
        cls = repeat(self.cls_token, "1 1 d -> b 1 d", b=x.shape[0])
        x = torch.cat((cls, x), dim=1) + self.pos_embedding
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x
        return self.head(self.pool(x))


def main():
    cfg = OmegaConf.load(Path(__file__).with_name("r5_einops_vit.yaml"))
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(sys.argv[1:]))
    print(OmegaConf.to_yaml(cfg))
    device = "cuda"
    model = ViT(**cfg.model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    for step in range(cfg.train.steps):
        img = torch.randn(cfg.train.batch_size, 3, cfg.model.image_size, cfg.model.image_size,
                          device=device)
        label = torch.randint(0, cfg.model.num_classes, (cfg.train.batch_size,), device=device)
        loss = nn.functional.cross_entropy(model(img), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
