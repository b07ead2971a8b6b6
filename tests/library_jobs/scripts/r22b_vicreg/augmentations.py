# ruff: noqa
"""facebookresearch/vicreg `augmentations.py` (main, cc1ef4f) re-created: two 224 px views per
image (bicubic RandomResizedCrop, flip, colour jitter, grayscale, PIL GaussianBlur with
probability 1.0 / 0.1, Solarization with probability 0.0 / 0.2, ImageNet normalization)."""

from PIL import ImageOps, ImageFilter
import numpy as np
import torchvision.transforms as transforms
from torchvision.transforms import InterpolationMode


class GaussianBlur(object):
    def __init__(self, p):
        self.p = p

    def __call__(self, img):
        if np.random.rand() < self.p:
            sigma = np.random.rand() * 1.9 + 0.1
            return img.filter(ImageFilter.GaussianBlur(sigma))
        else:
            return img


class Solarization(object):
    def __init__(self, p):
        self.p = p

    def __call__(self, img):
        if np.random.rand() < self.p:
            return ImageOps.solarize(img)
        else:
            return img


def _view(blur, solarize):
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(224, interpolation=InterpolationMode.BICUBIC),
            transforms.RandomHorizontalFlip(p=0.5),
            transforms.RandomApply(
                [transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)],
                p=0.8,
            ),
            transforms.RandomGrayscale(p=0.2),
            GaussianBlur(p=blur),
            Solarization(p=solarize),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )


class TrainTransform(object):
    def __init__(self):
        self.transform = _view(blur=1.0, solarize=0.0)
        self.transform_prime = _view(blur=0.1, solarize=0.2)

    def __call__(self, sample):
        x1 = self.transform(sample)
        x2 = self.transform_prime(sample)
        return x1, x2
