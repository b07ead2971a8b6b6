# ruff: noqa: UP031  (kept as the original script writes it)
"""WGAN-GP (Gulrajani et al., the improved_wgan_training / pytorch-wgan style): a critic trained
n_critic times per generator step, the gradient penalty through
`autograd.grad(create_graph=True)`, Adam(0.0, 0.9), no BatchNorm in the critic."""

import argparse
import os

import torch
import torch.nn as nn
from torch import autograd
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--n_epochs", type=int, default=1)
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--lr", type=float, default=1e-4)
parser.add_argument("--b1", type=float, default=0.0)
parser.add_argument("--b2", type=float, default=0.9)
parser.add_argument("--latent_dim", type=int, default=64)
parser.add_argument("--dim", type=int, default=128)
parser.add_argument("--img_size", type=int, default=28)
parser.add_argument("--n_critic", type=int, default=5)
parser.add_argument("--lambda_gp", type=float, default=10.0)
parser.add_argument("--samples", type=int, default=160)
parser.add_argument("--outf", default="")
opt = parser.parse_args()
print(opt)

cuda = torch.cuda.is_available()
img_shape = (1, opt.img_size, opt.img_size)
img_numel = opt.img_size * opt.img_size


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(opt.latent_dim, opt.dim), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(opt.dim, 2 * opt.dim), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(2 * opt.dim, img_numel), nn.Tanh(),
        )

    def forward(self, z):
        img = self.model(z)
        return img.view(img.shape[0], *img_shape)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(img_numel, 2 * opt.dim), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(2 * opt.dim, opt.dim), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(opt.dim, 1),
        )

    def forward(self, img):
        return self.model(img.view(img.shape[0], -1))


generator = Generator()
discriminator = Discriminator()
if cuda:
    generator.cuda()
    discriminator.cuda()

data = TensorDataset(torch.rand(opt.samples, *img_shape) * 2 - 1, torch.zeros(opt.samples, dtype=torch.long))
dataloader = DataLoader(data, batch_size=opt.batch_size, shuffle=True, drop_last=True)

optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor


def compute_gradient_penalty(D, real_samples, fake_samples):
    alpha = Tensor(torch.rand(real_samples.size(0), 1, 1, 1).numpy())
    interpolates = (alpha * real_samples + ((1 - alpha) * fake_samples)).requires_grad_(True)
    d_interpolates = D(interpolates)
    fake = torch.ones(real_samples.shape[0], 1, device=real_samples.device, requires_grad=False)
    gradients = autograd.grad(
        outputs=d_interpolates, inputs=interpolates, grad_outputs=fake,
        create_graph=True, retain_graph=True, only_inputs=True,
    )[0]
    gradients = gradients.view(gradients.size(0), -1)
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean()


batches_done = 0
for epoch in range(opt.n_epochs):
    for i, (imgs, _) in enumerate(dataloader):
        real_imgs = imgs.type(Tensor)
        optimizer_D.zero_grad()
        z = Tensor(torch.randn(imgs.shape[0], opt.latent_dim).numpy())
        fake_imgs = generator(z)
        real_validity = discriminator(real_imgs)
        fake_validity = discriminator(fake_imgs)
        gradient_penalty = compute_gradient_penalty(discriminator, real_imgs.data, fake_imgs.data)
        d_loss = -torch.mean(real_validity) + torch.mean(fake_validity) + opt.lambda_gp * gradient_penalty
        d_loss.backward()
        optimizer_D.step()
        optimizer_G.zero_grad()
        if i % opt.n_critic == 0:
            fake_imgs = generator(z)
            fake_validity = discriminator(fake_imgs)
            g_loss = -torch.mean(fake_validity)
            g_loss.backward()
            optimizer_G.step()
            print("[Epoch %d/%d] [Batch %d/%d] [D loss: %f] [G loss: %f]"
                  % (epoch, opt.n_epochs, i, len(dataloader), d_loss.item(), g_loss.item()))
            batches_done += opt.n_critic
    if opt.outf:
        torch.save(generator.state_dict(), os.path.join(opt.outf, "generator_%d.pth" % epoch))
