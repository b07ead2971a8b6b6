# ruff: noqa
"""facebookresearch/simsiam `simsiam/loader.py` (main, 833173b) re-created: two crops of one
image, and SimCLR's PIL Gaussian blur with a random radius."""

from PIL import ImageFilter
import random


class TwoCropsTransform:
    """The same augmentation applied twice: two views of one image."""

    def __init__(self, base_transform):
        self.base_transform = base_transform

    def __call__(self, x):
        q = self.base_transform(x)
        k = self.base_transform(x)
        return [q, k]


class GaussianBlur(object):
    """SimCLR's Gaussian blur (https://arxiv.org/abs/2002.05709)."""

    def __init__(self, sigma=[.1, 2.]):
        self.sigma = sigma

    def __call__(self, x):
        sigma = random.uniform(self.sigma[0], self.sigma[1])
        x = x.filter(ImageFilter.GaussianBlur(radius=sigma))
        return x
