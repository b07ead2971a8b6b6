# ruff: noqa
"""A local stand-in for `torchvision.datasets.Kinetics` (which decodes .avi / .mp4 through
PyAV, not installed here): `root/<split>/<class>/<video>.npy` uint8 (T, H, W, C) frame arrays,
cut into clips of `frames_per_clip` every `step_between_clips` frames, returned as Kinetics
returns them with `output_format="TCHW"`: (video, audio, label). `video_clips` is torchvision's
own `VideoClips`, built from the frame counts (`_precomputed_metadata`: one pts per frame, no
decoding), what its RandomClipSampler / UniformClipSampler read."""
import os

import numpy as np
import torch
from torchvision.datasets.video_utils import VideoClips


class KineticsFrames(torch.utils.data.Dataset):
    def __init__(self, root, frames_per_clip, split="train", step_between_clips=1, transform=None):
        folder = os.path.join(root, split)
        self.classes = sorted(os.listdir(folder))
        self.videos = [
            (os.path.join(folder, c, f), label)
            for label, c in enumerate(self.classes)
            for f in sorted(os.listdir(os.path.join(folder, c)))
        ]
        paths = [path for path, _ in self.videos]
        metadata = {
            "video_paths": paths,
            "video_pts": [torch.arange(np.load(p, mmap_mode="r", allow_pickle=False).shape[0]) for p in paths],
            "video_fps": [15.0] * len(paths),
        }
        self.video_clips = VideoClips(
            paths, frames_per_clip, step_between_clips, _precomputed_metadata=metadata, output_format="TCHW"
        )
        self.frames_per_clip = frames_per_clip
        self.transform = transform

    def __len__(self):
        return self.video_clips.num_clips()

    def __getitem__(self, idx):
        v, clip_idx = self.video_clips.get_clip_location(idx)
        start = int(self.video_clips.clips[v][clip_idx][0])
        path, label = self.videos[v]
        frames = np.load(path, mmap_mode="r", allow_pickle=False)[start : start + self.frames_per_clip]
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # TCHW
        audio = torch.empty((1, 0))
        if self.transform is not None:
            video = self.transform(video)
        return video, audio, label
