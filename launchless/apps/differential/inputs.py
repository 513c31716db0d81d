"""Fresh inputs that look like what the models meet in use, drawn from a caller's generator.

Every call draws new values (a graph replayed on stale inputs must show up as a difference), made on the CPU
from a ``torch.Generator`` and then moved, so a seed gives the same values on every device. Detectors and
segmenters get smooth fields with blobs and edges rather than white noise: noise gives no detections, so the
data-dependent parts of post-processing (score thresholds, non-maximum suppression) would never run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOBS = 6
RECTANGLES = 3


def _uniform(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=generator)


def smooth_images(generator: torch.Generator, batch: int, channels: int, height: int, width: int) -> torch.Tensor:
    """Images in [0, 1]: a smooth random field, Gaussian blobs and flat rectangles with sharp edges."""
    coarse = _uniform(generator, batch, channels, max(2, height // 32), max(2, width // 32))
    images = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    rows = torch.arange(height).view(1, height, 1).float()
    cols = torch.arange(width).view(1, 1, width).float()
    for _ in range(BLOBS):
        centre = _uniform(generator, batch, 2)
        radius = 0.03 + 0.12 * _uniform(generator, batch, 1)
        distance = ((rows - centre[:, 0, None, None] * height) / height) ** 2 + (
            (cols - centre[:, 1, None, None] * width) / width
        ) ** 2
        blob = torch.exp(-distance / (2 * radius[:, :, None] ** 2))
        images = images + blob[:, None] * (_uniform(generator, batch, channels, 1, 1) - 0.5)
    for _ in range(RECTANGLES):
        corners = _uniform(generator, batch, 4)
        top, left = (corners[:, 0] * height * 0.7).long(), (corners[:, 1] * width * 0.7).long()
        tall, wide = (8 + corners[:, 2] * height * 0.3).long(), (8 + corners[:, 3] * width * 0.3).long()
        colour = _uniform(generator, batch, channels)
        for b in range(batch):
            images[b, :, top[b] : top[b] + tall[b], left[b] : left[b] + wide[b]] = colour[b, :, None, None]
    return images.clamp(0, 1)


def normalized_images(generator: torch.Generator, batch: int, channels: int, height: int, width: int) -> torch.Tensor:
    """Smooth images standardised as a classifier's preprocessing leaves them (about zero mean, unit spread)."""
    return (smooth_images(generator, batch, channels, height, width) - 0.45) / 0.25


def image_list(generator: torch.Generator, count: int, height: int, width: int) -> list[torch.Tensor]:
    """A detector's input: a list of 3-channel images in [0, 1]."""
    return list(smooth_images(generator, count, 3, height, width))


def video_clip(generator: torch.Generator, batch: int, frames: int, size: int) -> torch.Tensor:
    """(batch, 3, frames, size, size): one scene drifting across frames, as a clip moves."""
    scene = normalized_images(generator, batch, 3, size, size + frames)
    return torch.stack([scene[..., t : t + size] for t in range(frames)], dim=2)


def image_pair(generator: torch.Generator, batch: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two consecutive frames for optical flow: the second is the first shifted by a few pixels, in [-1, 1]."""
    scene = smooth_images(generator, batch, 3, height, width + 8) * 2 - 1
    shift = int(torch.randint(1, 8, (1,), generator=generator))
    return scene[..., :width].contiguous(), scene[..., shift : shift + width].contiguous()


def view_pairs(generator: torch.Generator, batch: int, channels: int, height: int, width: int) -> torch.Tensor:
    """(batch, 2, channels, height, width) in [0, 1]: two views of one scene a few pixels apart, for matchers."""
    scene = smooth_images(generator, batch, channels, height, width + 8)
    shift = int(torch.randint(1, 8, (1,), generator=generator))
    return torch.stack([scene[..., :width], scene[..., shift : shift + width]], dim=1).contiguous()


def token_ids(generator: torch.Generator, batch: int, length: int, vocab: int) -> torch.Tensor:
    """Ids away from both ends of the vocabulary, where special and remapped multimodal tokens live."""
    low, high = min(4, vocab - 1), max(5, vocab // 2)
    return torch.randint(low, high, (batch, length), generator=generator)


def boxes(generator: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """(batch, length, 4) word boxes (x0, y0, x1, y1) on a unit page, corners ordered (x0 <= x1, y0 <= y1)."""
    corners = _uniform(generator, batch, length, 2, 2)  # two corners, each (x, y)
    low, high = corners.min(dim=2).values, corners.max(dim=2).values
    return torch.cat([low, high], dim=-1)


def waveform(generator: torch.Generator, batch: int, samples: int) -> torch.Tensor:
    """Speech-like audio: a few tones with a slowly changing loudness, plus a little noise."""
    time = torch.arange(samples).float() / 16000
    tones = 100 + 900 * _uniform(generator, batch, 3, 1)
    signal = torch.sin(2 * torch.pi * tones * time).sum(1)
    envelope = F.interpolate(_uniform(generator, batch, 1, 8), size=samples, mode="linear").squeeze(1)
    return 0.1 * signal * envelope + 0.01 * torch.randn(batch, samples, generator=generator)


def features(generator: torch.Generator, *shape: int) -> torch.Tensor:
    """Standard-normal features (log-mel frames, latents, text states)."""
    return torch.randn(*shape, generator=generator)
