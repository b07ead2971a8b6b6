# ruff: noqa
"""A reduced ultralytics/yolov5 `utils/dataloaders.py` (v7.0): `create_dataloader` over
`LoadImagesAndLabels` (images/*.jpg with labels/*.txt of `class x y w h` rows, normalized),
images resized to `img_size` square (no mosaic / letterbox / HSV augmentation), HWC->CHW uint8,
`collate_fn` writing each label's image index into column 0, an InfiniteDataLoader-free
DataLoader with `shuffle`, `pin_memory=True`."""
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset


def img2label_paths(img_paths):
    # Define label paths as a function of image paths
    sa, sb = f'{os.sep}images{os.sep}', f'{os.sep}labels{os.sep}'  # /images/, /labels/ substrings
    return [sb.join(x.rsplit(sa, 1)).rsplit('.', 1)[0] + '.txt' for x in img_paths]


class LoadImagesAndLabels(Dataset):
    def __init__(self, path, img_size=640, batch_size=16, augment=False, hyp=None, stride=32, prefix=''):
        self.img_size = img_size
        self.im_files = sorted(str(p) for p in Path(path).glob('*.jpg'))
        self.label_files = img2label_paths(self.im_files)
        self.labels = [np.loadtxt(f, ndmin=2, dtype=np.float32) for f in self.label_files]
        print(f'{prefix}Scanning {path}... {len(self.im_files)} images, {sum(len(x) for x in self.labels)} labels')

    def __len__(self):
        return len(self.im_files)

    def __getitem__(self, index):
        img = Image.open(self.im_files[index]).convert('RGB').resize((self.img_size, self.img_size))
        labels = self.labels[index]
        nl = len(labels)  # number of labels
        labels_out = torch.zeros((nl, 6))
        if nl:
            labels_out[:, 1:] = torch.from_numpy(labels)

        # Convert
        img = np.asarray(img).transpose((2, 0, 1))  # HWC to CHW
        img = np.ascontiguousarray(img)

        return torch.from_numpy(img), labels_out, self.im_files[index], None

    @staticmethod
    def collate_fn(batch):
        im, label, path, shapes = zip(*batch)  # transposed
        for i, lb in enumerate(label):
            lb[:, 0] = i  # add target image index for build_targets()
        return torch.stack(im, 0), torch.cat(label, 0), path, shapes


def create_dataloader(path, imgsz, batch_size, stride, hyp=None, augment=False, workers=8, shuffle=False, prefix=''):
    dataset = LoadImagesAndLabels(path, imgsz, batch_size, augment=augment, hyp=hyp, stride=int(stride), prefix=prefix)
    batch_size = min(batch_size, len(dataset))
    nd = torch.cuda.device_count()  # number of CUDA devices
    nw = min([os.cpu_count() // max(nd, 1), batch_size if batch_size > 1 else 0, workers])  # number of workers
    generator = torch.Generator()
    generator.manual_seed(6148914691236517205)
    return DataLoader(dataset,
                      batch_size=batch_size,
                      shuffle=shuffle,
                      num_workers=nw,
                      pin_memory=True,
                      collate_fn=LoadImagesAndLabels.collate_fn,
                      generator=generator), dataset
