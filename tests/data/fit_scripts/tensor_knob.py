"""Holds N blocks of 512 MiB on the GPU: peak memory exactly linear in --blocks."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--blocks", type=int, required=True)
args = parser.parse_args()
x = torch.empty(args.blocks * 2**27, device="cuda")  # 2**27 float32 = 512 MiB each
print(x.shape)
