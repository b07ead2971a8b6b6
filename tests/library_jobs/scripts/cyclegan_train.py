# ruff: noqa: B007  (kept as the original code writes it)
"""junyanz/pytorch-CycleGAN-and-pix2pix style CycleGAN training: two ResNet generators and two
PatchGAN discriminators, one Adam over itertools.chain of both generators and one over both
discriminators, LSGAN (MSE) + cycle + identity losses, an ImagePool of past fakes,
set_requires_grad on the discriminators, LambdaLR linear decay, per-epoch `latest_net_*.pth`."""

import argparse
import itertools
import os
import random

import torch
import torch.nn as nn
from torch.optim import lr_scheduler
from torch.utils.data import DataLoader, Dataset


class ResnetBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv_block = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, 3, bias=True), nn.InstanceNorm2d(dim), nn.ReLU(True),
            nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, 3, bias=True), nn.InstanceNorm2d(dim))

    def forward(self, x):
        return x + self.conv_block(x)


class ResnetGenerator(nn.Module):
    def __init__(self, input_nc, output_nc, ngf=64, n_blocks=9):
        super().__init__()
        model = [nn.ReflectionPad2d(3), nn.Conv2d(input_nc, ngf, 7, bias=True), nn.InstanceNorm2d(ngf), nn.ReLU(True)]
        for i in range(2):
            mult = 2 ** i
            model += [nn.Conv2d(ngf * mult, ngf * mult * 2, 3, stride=2, padding=1, bias=True),
                      nn.InstanceNorm2d(ngf * mult * 2), nn.ReLU(True)]
        mult = 4
        for i in range(n_blocks):
            model += [ResnetBlock(ngf * mult)]
        for i in range(2):
            mult = 2 ** (2 - i)
            model += [nn.ConvTranspose2d(ngf * mult, ngf * mult // 2, 3, stride=2, padding=1,
                                         output_padding=1, bias=True),
                      nn.InstanceNorm2d(ngf * mult // 2), nn.ReLU(True)]
        model += [nn.ReflectionPad2d(3), nn.Conv2d(ngf, output_nc, 7), nn.Tanh()]
        self.model = nn.Sequential(*model)

    def forward(self, input):
        return self.model(input)


class NLayerDiscriminator(nn.Module):
    def __init__(self, input_nc, ndf=64, n_layers=3):
        super().__init__()
        sequence = [nn.Conv2d(input_nc, ndf, 4, stride=2, padding=1), nn.LeakyReLU(0.2, True)]
        nf_mult = 1
        for n in range(1, n_layers):
            nf_mult_prev, nf_mult = nf_mult, min(2 ** n, 8)
            sequence += [nn.Conv2d(ndf * nf_mult_prev, ndf * nf_mult, 4, stride=2, padding=1, bias=True),
                         nn.InstanceNorm2d(ndf * nf_mult), nn.LeakyReLU(0.2, True)]
        nf_mult_prev, nf_mult = nf_mult, min(2 ** n_layers, 8)
        sequence += [nn.Conv2d(ndf * nf_mult_prev, ndf * nf_mult, 4, stride=1, padding=1, bias=True),
                     nn.InstanceNorm2d(ndf * nf_mult), nn.LeakyReLU(0.2, True)]
        sequence += [nn.Conv2d(ndf * nf_mult, 1, 4, stride=1, padding=1)]
        self.model = nn.Sequential(*sequence)

    def forward(self, input):
        return self.model(input)


class ImagePool:
    def __init__(self, pool_size):
        self.pool_size = pool_size
        self.num_imgs = 0
        self.images = []

    def query(self, images):
        if self.pool_size == 0:
            return images
        return_images = []
        for image in images:
            image = torch.unsqueeze(image.data, 0)
            if self.num_imgs < self.pool_size:
                self.num_imgs = self.num_imgs + 1
                self.images.append(image)
                return_images.append(image)
            else:
                p = random.uniform(0, 1)
                if p > 0.5:
                    random_id = random.randint(0, self.pool_size - 1)
                    tmp = self.images[random_id].clone()
                    self.images[random_id] = image
                    return_images.append(tmp)
                else:
                    return_images.append(image)
        return torch.cat(return_images, 0)


class UnalignedDataset(Dataset):
    def __init__(self, n, size):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return {"A": torch.rand(3, self.size, self.size) * 2 - 1, "B": torch.rand(3, self.size, self.size) * 2 - 1,
                "A_paths": f"a/{index}.jpg", "B_paths": f"b/{index}.jpg"}


def set_requires_grad(nets, requires_grad=False):
    if not isinstance(nets, list):
        nets = [nets]
    for net in nets:
        if net is not None:
            for param in net.parameters():
                param.requires_grad = requires_grad


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="experiment_name")
    parser.add_argument("--checkpoints_dir", default="./checkpoints")
    parser.add_argument("--gpu_ids", default="0")
    parser.add_argument("--ngf", type=int, default=64)
    parser.add_argument("--ndf", type=int, default=64)
    parser.add_argument("--n_blocks", type=int, default=9)
    parser.add_argument("--crop_size", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--n_epochs", type=int, default=100)
    parser.add_argument("--n_epochs_decay", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.0002)
    parser.add_argument("--beta1", type=float, default=0.5)
    parser.add_argument("--pool_size", type=int, default=50)
    parser.add_argument("--lambda_A", type=float, default=10.0)
    parser.add_argument("--lambda_B", type=float, default=10.0)
    parser.add_argument("--lambda_identity", type=float, default=0.5)
    parser.add_argument("--max_dataset_size", type=int, default=8)
    opt = parser.parse_args()
    gpu_ids = [int(i) for i in opt.gpu_ids.split(",") if int(i) >= 0]
    if gpu_ids:
        torch.cuda.set_device(gpu_ids[0])
    device = torch.device(f"cuda:{gpu_ids[0]}") if gpu_ids else torch.device("cpu")

    netG_A = ResnetGenerator(3, 3, opt.ngf, opt.n_blocks).to(device)
    netG_B = ResnetGenerator(3, 3, opt.ngf, opt.n_blocks).to(device)
    netD_A = NLayerDiscriminator(3, opt.ndf).to(device)
    netD_B = NLayerDiscriminator(3, opt.ndf).to(device)
    for net in (netG_A, netG_B, netD_A, netD_B):
        for m in net.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.normal_(m.weight.data, 0.0, 0.02)
                if m.bias is not None:
                    nn.init.constant_(m.bias.data, 0.0)
    fake_A_pool, fake_B_pool = ImagePool(opt.pool_size), ImagePool(opt.pool_size)
    criterionGAN = nn.MSELoss()
    criterionCycle = nn.L1Loss()
    criterionIdt = nn.L1Loss()
    optimizer_G = torch.optim.Adam(itertools.chain(netG_A.parameters(), netG_B.parameters()),
                                   lr=opt.lr, betas=(opt.beta1, 0.999))
    optimizer_D = torch.optim.Adam(itertools.chain(netD_A.parameters(), netD_B.parameters()),
                                   lr=opt.lr, betas=(opt.beta1, 0.999))

    def lambda_rule(epoch):
        return 1.0 - max(0, epoch + 1 - opt.n_epochs) / float(opt.n_epochs_decay + 1)

    schedulers = [lr_scheduler.LambdaLR(o, lr_lambda=lambda_rule) for o in (optimizer_G, optimizer_D)]
    dataset = DataLoader(UnalignedDataset(opt.max_dataset_size, opt.crop_size), batch_size=opt.batch_size,
                         shuffle=True, num_workers=4)

    def gan_loss(pred, target_is_real):
        target = torch.tensor(1.0 if target_is_real else 0.0, device=pred.device).expand_as(pred)
        return criterionGAN(pred, target)

    total_iters = 0
    for epoch in range(1, opt.n_epochs + opt.n_epochs_decay + 1):
        for i, data in enumerate(dataset):
            real_A, real_B = data["A"].to(device), data["B"].to(device)
            total_iters += opt.batch_size
            fake_B = netG_A(real_A)
            rec_A = netG_B(fake_B)
            fake_A = netG_B(real_B)
            rec_B = netG_A(fake_A)
            # G_A and G_B
            set_requires_grad([netD_A, netD_B], False)
            optimizer_G.zero_grad()
            idt_A = netG_A(real_B)
            loss_idt_A = criterionIdt(idt_A, real_B) * opt.lambda_B * opt.lambda_identity
            idt_B = netG_B(real_A)
            loss_idt_B = criterionIdt(idt_B, real_A) * opt.lambda_A * opt.lambda_identity
            loss_G_A = gan_loss(netD_A(fake_B), True)
            loss_G_B = gan_loss(netD_B(fake_A), True)
            loss_cycle_A = criterionCycle(rec_A, real_A) * opt.lambda_A
            loss_cycle_B = criterionCycle(rec_B, real_B) * opt.lambda_B
            loss_G = loss_G_A + loss_G_B + loss_cycle_A + loss_cycle_B + loss_idt_A + loss_idt_B
            loss_G.backward()
            optimizer_G.step()
            # D_A and D_B
            set_requires_grad([netD_A, netD_B], True)
            optimizer_D.zero_grad()
            fake_B_ = fake_B_pool.query(fake_B)
            loss_D_A = (gan_loss(netD_A(real_B), True) + gan_loss(netD_A(fake_B_.detach()), False)) * 0.5
            loss_D_A.backward()
            fake_A_ = fake_A_pool.query(fake_A)
            loss_D_B = (gan_loss(netD_B(real_A), True) + gan_loss(netD_B(fake_A_.detach()), False)) * 0.5
            loss_D_B.backward()
            optimizer_D.step()
            if total_iters % 4 == 0:
                print(f"(epoch: {epoch}, iters: {i}) G: {loss_G.item():.3f} D_A: {loss_D_A.item():.3f} "
                      f"D_B: {loss_D_B.item():.3f}")
        save_dir = os.path.join(opt.checkpoints_dir, opt.name)
        os.makedirs(save_dir, exist_ok=True)
        for name, net in (("G_A", netG_A), ("G_B", netG_B), ("D_A", netD_A), ("D_B", netD_B)):
            torch.save(net.cpu().state_dict(), os.path.join(save_dir, f"latest_net_{name}.pth"))
            net.cuda(gpu_ids[0])
        for scheduler in schedulers:
            scheduler.step()


if __name__ == "__main__":
    main()
