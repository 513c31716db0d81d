"""Data for `launchless train`: a generated tiny ImageFolder and the train/val loaders for any ImageFolder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...errors import ConfigError

# ImageNet statistics: what timm's models are usually normalised with.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# One colour per class (cycled past eight classes).
_PALETTE = np.array(
    [
        (230, 60, 60),
        (60, 190, 70),
        (60, 90, 230),
        (230, 200, 50),
        (190, 60, 200),
        (50, 200, 210),
        (240, 140, 40),
        (150, 150, 150),
    ],
    dtype=np.float32,
)


def _class_image(rng: np.random.Generator, c: int, size: int) -> np.ndarray:
    """A ``size`` x ``size`` RGB image of class ``c``.

    The main cue is a stripe pattern whose orientation (0/45/90/135 degrees) and period (4/6/8 px) depend on
    the class, at a random phase; a weak cue is the colour, 30% the class colour and 70% a random one;
    brightness jitter and per-pixel noise on top. Solid, not trivial: resnet18 from random weights goes from
    about 70% to about 95% validation accuracy over five short epochs at 64 images per class.
    """
    colour = 0.3 * _PALETTE[c % len(_PALETTE)] + 0.7 * rng.uniform(40, 230, size=3)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    angle = np.pi * (c % 4) / 4
    period = 4.0 + 2.0 * (c % 3)
    phase = rng.uniform(0, 2 * np.pi)
    wave = np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period + phase)
    stripes = 0.55 + 0.45 * (wave > 0)  # bright and dim bands
    image = colour[None, None, :] * stripes[..., None]
    image = image * rng.uniform(0.8, 1.2) + rng.normal(0.0, 25.0, size=(size, size, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def make_tiny_imagefolder(
    root: str | Path, classes: int = 3, per_class: int = 16, size: int = 32, seed: int = 0
) -> Path:
    """Write a deterministic tiny ImageFolder under ``root`` and return ``root``.

    Layout: ``root/{train,val}/class_NN/NNNN.png``; ``per_class`` training images per class and
    ``max(2, per_class // 2)`` validation images per class. Each class has its own stripe pattern and a
    colour bias, plus noise, so a small model from random weights gets well above chance within a few
    epochs. The same arguments give byte-identical files. Up to 12 classes have distinct patterns.
    """
    from PIL import Image

    if classes < 2 or per_class < 1 or size < 8:
        raise ConfigError(
            f"make_tiny_imagefolder(classes={classes}, per_class={per_class}, size={size}): "
            "pass classes >= 2, per_class >= 1 and size >= 8"
        )
    root = Path(root)
    rng = np.random.default_rng(seed)
    counts = {"train": per_class, "val": max(2, per_class // 2)}
    for split, count in counts.items():
        for c in range(classes):
            folder = root / split / f"class_{c:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(_class_image(rng, c, size), mode="RGB").save(folder / f"{i:04d}.png")
    return root


def _check_split(root: Path, split: str) -> None:
    folder = root / split
    fix = (
        f"point --data at a folder holding train/ and val/, each with one sub-folder of images per class "
        f"(torchvision ImageFolder layout: {root}/train/<class>/<image>.png), or use --tiny-data to generate one"
    )
    if not root.is_dir():
        raise ConfigError(f"data directory {root} does not exist; {fix}")
    if not folder.is_dir():
        raise ConfigError(f"data directory {root} has no {split}/ sub-folder; {fix}")
    classes = [d for d in folder.iterdir() if d.is_dir()]
    if not classes:
        raise ConfigError(f"{folder} has no class sub-folders; {fix}")
    if not any(f.suffix.lower() in IMAGE_SUFFIXES for d in classes for f in d.rglob("*")):
        raise ConfigError(f"{folder} has class sub-folders but no images ({', '.join(IMAGE_SUFFIXES)}); {fix}")


def check_imagefolder(root: str | Path) -> None:
    """Raises ``ConfigError`` naming the fix unless ``root`` holds ``train/`` and ``val/`` with class sub-folders of
    images: checked before any image is read (or any training process started)."""
    for split in ("train", "val"):
        _check_split(Path(root), split)


def loaders(
    root: str | Path,
    batch: int,
    size: int,
    workers: int = 2,
    pin_memory: bool = False,
    seed: int = 0,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader, int]:
    """``(train_loader, val_loader, num_classes)`` for the ImageFolder at ``root`` (``train/`` and ``val/``).

    Images are resized (shorter side) and centre-cropped to ``size`` x ``size``, converted to tensors and
    normalised with the ImageNet statistics. The train loader shuffles with a generator seeded by ``seed``.
    With ``world_size`` > 1 the train loader yields this ``rank``'s share of every epoch: a ``DistributedSampler``
    seeded by ``seed`` deals one shuffled order, the same on every rank, into disjoint equal shares (call its
    ``set_epoch`` once per epoch to reshuffle); ``batch`` is per rank. The validation loader is the whole set.
    """
    from torchvision import datasets, transforms

    root = Path(root)
    check_imagefolder(root)
    if batch < 1:
        raise ConfigError(f"batch={batch}: pass a batch size >= 1")
    if workers < 0:
        raise ConfigError(f"workers={workers}: pass 0 (load in the main process) or more")
    transform = transforms.Compose(
        [
            transforms.Resize(size),
            transforms.CenterCrop(size),  # Resize(int) keeps the aspect ratio; the crop makes every image square
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    try:
        train_set = datasets.ImageFolder(str(root / "train"), transform=transform)
        val_set = datasets.ImageFolder(str(root / "val"), transform=transform)
    except FileNotFoundError as exc:  # a class sub-folder without images
        raise ConfigError(f"{root} is not a usable ImageFolder: {exc}; give every class sub-folder images") from exc
    if train_set.classes != val_set.classes:
        raise ConfigError(
            f"train/ and val/ under {root} name different classes ({train_set.classes} vs {val_set.classes}); "
            "give both splits the same class sub-folders"
        )
    per_rank = len(train_set) // world_size
    if per_rank < batch:
        share = f", {per_rank} per process over {world_size} processes" if world_size > 1 else ""
        raise ConfigError(
            f"the training set has {len(train_set)} images{share}, fewer than one batch of {batch}; "
            f"lower --batch to at most {per_rank} (the last partial batch is dropped)"
        )
    generator = torch.Generator().manual_seed(seed)
    common = {"num_workers": workers, "pin_memory": pin_memory, "persistent_workers": workers > 0}
    sampler = None
    if world_size > 1:  # drop_last: equal shares, so that every rank makes as many steps (DDP's all-reduces pair up)
        sampler = torch.utils.data.DistributedSampler(
            train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
    # drop_last=True: every training batch has the same shape, so a whole-step CUDA graph captured for
    # one batch signature replays for every batch; a smaller last batch would be a new signature that
    # runs eager (or costs a second capture) once per epoch.
    train_loader = torch.utils.data.DataLoader(
        train_set,
        batch_size=batch,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=True,
        generator=generator,
        **common,
    )
    # Validation runs eager in eval mode: keep every image, the last batch may be smaller.
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=batch, shuffle=False, drop_last=False, **common)
    return train_loader, val_loader, len(train_set.classes)
