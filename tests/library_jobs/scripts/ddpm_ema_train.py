# ruff: noqa: B905  (kept as the original code writes it)
"""A DDPM training loop as denoising-diffusion-pytorch / diffusers' train_unconditional write it:
a small UNet-like noise predictor, a linear beta schedule registered as buffers, random
timesteps per sample, MSE on the noise, AdamW, an EMA copy made with copy.deepcopy and updated
with lerp_ under no_grad, sampling from the EMA model every few steps."""

import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        half_dim = self.dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=x.device) * -emb)
        emb = x[:, None] * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class ResBlock(nn.Module):
    def __init__(self, dim, dim_out, time_dim, groups=8):
        super().__init__()
        self.mlp = nn.Sequential(nn.SiLU(), nn.Linear(time_dim, dim_out * 2))
        self.block1 = nn.Sequential(nn.Conv2d(dim, dim_out, 3, padding=1), nn.GroupNorm(groups, dim_out), nn.SiLU())
        self.block2 = nn.Sequential(nn.Conv2d(dim_out, dim_out, 3, padding=1), nn.GroupNorm(groups, dim_out), nn.SiLU())
        self.res_conv = nn.Conv2d(dim, dim_out, 1) if dim != dim_out else nn.Identity()

    def forward(self, x, t):
        scale, shift = self.mlp(t)[:, :, None, None].chunk(2, dim=1)
        h = self.block1(x)
        h = h * (scale + 1) + shift
        h = self.block2(h)
        return h + self.res_conv(x)


class Unet(nn.Module):
    def __init__(self, dim=32, channels=3, dim_mults=(1, 2)):
        super().__init__()
        self.channels = channels
        time_dim = dim * 4
        self.time_mlp = nn.Sequential(SinusoidalPosEmb(dim), nn.Linear(dim, time_dim), nn.GELU(),
                                      nn.Linear(time_dim, time_dim))
        self.init_conv = nn.Conv2d(channels, dim, 7, padding=3)
        dims = [dim] + [dim * m for m in dim_mults]
        self.downs = nn.ModuleList()
        self.ups = nn.ModuleList()
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            self.downs.append(nn.ModuleList([ResBlock(d_in, d_out, time_dim),
                                             nn.Conv2d(d_out, d_out, 4, 2, 1)]))
        self.mid = ResBlock(dims[-1], dims[-1], time_dim)
        for d_in, d_out in zip(reversed(dims[1:]), reversed(dims[:-1])):
            self.ups.append(nn.ModuleList([nn.ConvTranspose2d(d_in, d_in, 4, 2, 1),
                                           ResBlock(d_in * 2, d_out, time_dim)]))
        self.final_conv = nn.Conv2d(dim, channels, 1)

    def forward(self, x, time):
        t = self.time_mlp(time)
        x = self.init_conv(x)
        skips = []
        for block, down in self.downs:
            x = block(x, t)
            skips.append(x)
            x = down(x)
        x = self.mid(x, t)
        for up, block in self.ups:
            x = up(x)
            x = torch.cat((x, skips.pop()), dim=1)
            x = block(x, t)
        return self.final_conv(x)


class GaussianDiffusion(nn.Module):
    def __init__(self, model, image_size, timesteps=1000):
        super().__init__()
        self.model = model
        self.image_size = image_size
        self.num_timesteps = timesteps
        betas = torch.linspace(1e-4, 0.02, timesteps, dtype=torch.float64)
        alphas = 1.0 - betas
        alphas_cumprod = torch.cumprod(alphas, dim=0)

        def register_buffer(name, val):
            self.register_buffer(name, val.to(torch.float32))

        register_buffer("betas", betas)
        register_buffer("alphas_cumprod", alphas_cumprod)
        register_buffer("sqrt_alphas_cumprod", torch.sqrt(alphas_cumprod))
        register_buffer("sqrt_one_minus_alphas_cumprod", torch.sqrt(1.0 - alphas_cumprod))
        register_buffer("sqrt_recip_alphas", torch.sqrt(1.0 / alphas))

    def q_sample(self, x_start, t, noise):
        return (self.sqrt_alphas_cumprod[t][:, None, None, None] * x_start
                + self.sqrt_one_minus_alphas_cumprod[t][:, None, None, None] * noise)

    def forward(self, img):
        b = img.shape[0]
        t = torch.randint(0, self.num_timesteps, (b,), device=img.device).long()
        noise = torch.randn_like(img)
        x = self.q_sample(img, t, noise)
        pred = self.model(x, t.float())
        return F.mse_loss(pred, noise)

    @torch.inference_mode()
    def sample(self, batch_size, steps):
        img = torch.randn(batch_size, self.model.channels, self.image_size, self.image_size,
                          device=self.betas.device)
        for i in tqdm(reversed(range(0, steps)), desc="sampling loop time step", total=steps, leave=False):
            t = torch.full((batch_size,), i, device=img.device, dtype=torch.long)
            eps = self.model(img, t.float())
            coef = self.betas[t] / self.sqrt_one_minus_alphas_cumprod[t]
            img = self.sqrt_recip_alphas[t][:, None, None, None] * (img - coef[:, None, None, None] * eps)
            if i > 0:
                img = img + self.betas[t].sqrt()[:, None, None, None] * torch.randn_like(img)
        return img.clamp(-1, 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--train-num-steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=8e-5)
    parser.add_argument("--ema-decay", type=float, default=0.995)
    parser.add_argument("--save-and-sample-every", type=int, default=50)
    parser.add_argument("--sampling-steps", type=int, default=4)
    parser.add_argument("--samples", type=int, default=64)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Unet(dim=args.dim)
    diffusion = GaussianDiffusion(model, image_size=args.image_size).to(device)
    ema = copy.deepcopy(diffusion).eval().requires_grad_(False)
    opt = torch.optim.AdamW(diffusion.parameters(), lr=args.lr, betas=(0.9, 0.99))
    data = TensorDataset(torch.rand(args.samples, 3, args.image_size, args.image_size) * 2 - 1)
    dl = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)

    def cycle(loader):
        while True:
            yield from loader

    dl = cycle(dl)
    step = 0
    with tqdm(initial=step, total=args.train_num_steps) as pbar:
        while step < args.train_num_steps:
            (img,) = next(dl)
            img = img.to(device)
            loss = diffusion(img)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(diffusion.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                for ema_p, p in zip(ema.parameters(), diffusion.parameters()):
                    ema_p.lerp_(p, 1 - args.ema_decay)
            pbar.set_description(f"loss: {loss.item():.4f}")
            step += 1
            if step % args.save_and_sample_every == 0:
                samples = ema.sample(batch_size=4, steps=args.sampling_steps)
                torch.save({"step": step, "model": diffusion.state_dict(), "ema": ema.state_dict(),
                            "opt": opt.state_dict()}, f"model-{step}.pt")
                print(samples.shape)
            pbar.update(1)


if __name__ == "__main__":
    main()
