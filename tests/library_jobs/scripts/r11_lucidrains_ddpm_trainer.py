"""lucidrains/denoising-diffusion-pytorch: the README's "Usage" with its `Trainer`, unchanged
but for the sizes (read from the command line): `Unet(dim, dim_mults, flash_attn=True)`,
`GaussianDiffusion(model, image_size, timesteps, sampling_timesteps)` (DDIM sampling when fewer
sampling steps than timesteps), and `Trainer(diffusion, folder, train_batch_size, train_lr,
train_num_steps, gradient_accumulate_every, ema_decay, amp=True, calculate_fid=...)`, then
`trainer.train()`.

The Trainer (denoising_diffusion_pytorch.py) builds an accelerate `Accelerator(split_batches=True,
mixed_precision='fp16')`, a DataLoader over the folder's images (`num_workers=cpu_count()`,
cycled forever with `next(self.dl)`), Adam, an `ema_pytorch.EMA` copy moved to the device, and
each step: `gradient_accumulate_every` forward / backward passes under `accelerator.autocast()`
reading `loss.item()`, `clip_grad_norm_`, `opt.step()`, `ema.update()`; every
`save_and_sample_every` steps it samples `num_samples` images from the EMA model under
`torch.inference_mode()`, writes them with `torchvision.utils.save_image` and `torch.save`s
the model, optimizer, EMA and scaler state to results/model-N.pt.

`calculate_fid=True` (the README's) downloads InceptionV3 weights: the test passes
--no-fid (no network at run time).

To run: python r11_lucidrains_ddpm_trainer.py path/to/your/images
"""
import argparse

from denoising_diffusion_pytorch import GaussianDiffusion, Trainer, Unet

parser = argparse.ArgumentParser()
parser.add_argument("folder")
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--dim-mults", type=int, nargs="+", default=[1, 2, 4, 8])
parser.add_argument("--image-size", type=int, default=128)
parser.add_argument("--timesteps", type=int, default=1000)
parser.add_argument("--sampling-timesteps", type=int, default=250)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--accumulate", type=int, default=2)
parser.add_argument("--steps", type=int, default=700000)
parser.add_argument("--save-every", type=int, default=1000)
parser.add_argument("--num-samples", type=int, default=25)
parser.add_argument("--results", default="./results")
parser.add_argument("--no-fid", action="store_true")
args = parser.parse_args()

model = Unet(
    dim = args.dim,
    dim_mults = tuple(args.dim_mults),
    flash_attn = True
)

diffusion = GaussianDiffusion(
    model,
    image_size = args.image_size,
    timesteps = args.timesteps,           # number of steps
    sampling_timesteps = args.sampling_timesteps  # number of sampling timesteps (using ddim for faster inference [see citation for ddim paper])
)

trainer = Trainer(
    diffusion,
    args.folder,
    train_batch_size = args.batch_size,
    train_lr = 8e-5,
    train_num_steps = args.steps,         # total training steps
    gradient_accumulate_every = args.accumulate,    # gradient accumulation steps
    ema_decay = 0.995,                # exponential moving average decay
    amp = True,                       # turn on mixed precision
    calculate_fid = not args.no_fid,  # whether to calculate fid during training
    save_and_sample_every = args.save_every,
    num_samples = args.num_samples,
    results_folder = args.results,
)

trainer.train()
