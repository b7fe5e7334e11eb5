"""Figure/ground segmentation of photographs: folders of colour images and their masks, read with Pillow, resized to
one h x w grid and turned into Domke's features (``image_features``), and the datamodule of ``data=horses``.

A folder (``root``) is laid out either

- ``<root>/<images>/*.jpg`` + ``<root>/<masks>/*.jpg``: split into train and test by a seeded ``test_fraction``, or
- ``<root>/train/{<images>,<masks>}/`` + ``<root>/test/{<images>,<masks>}/``: a fixed split.

``images`` / ``masks`` default to the Weizmann horses' ``rgb`` / ``figure_ground``. An image and its mask share a
file name stem (``horse001.jpg`` and ``horse001.jpg`` or ``.png``); a mask is a grey image at any size of the
same aspect ratio, figure where it is >= ``threshold`` (128 of 255: the horses' masks are lossy JPEGs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.nn import functional as F

from ..folds import train_val_indices
from ..graph import check_int
from .download import horses_dir
from .grid import GridDataModule
from .image_features import pairwise_features, unary_features

__all__ = ["IMAGE_SUFFIXES", "SegmentationDataModule", "SegmentationImages", "find_image_pairs", "load_segmentation",
           "read_image"]

#: the file types read as images or masks (case-insensitive); other files in the folders are ignored
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff")
#: largest relative difference of an image's and its mask's aspect ratios (the horses': 0.9 %)
ASPECT_TOLERANCE = 0.05


@dataclass
class SegmentationImages:
    """N images resized to an h x w grid (n = h * w pixels, node r * w + c; E edges of ``Graph.grid(h, w)``).

    rgb: [N, 3, h, w] float32 in [0, 1]; unary: [N, n, 42]; pairwise: [N, E, 3] (``image_features``);
    y: [N, n] int64, 1 = figure; names: the N image files' stems.
    """

    rgb: torch.Tensor
    unary: torch.Tensor
    pairwise: torch.Tensor
    y: torch.Tensor
    height: int
    width: int
    names: list[str]


def _images_in(folder: Path) -> dict[str, Path]:
    """Stem -> image file of ``folder``; ValueError if it is no folder, holds no image or two images of one stem."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    files: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() not in IMAGE_SUFFIXES or path.name.startswith("."):
            continue
        if path.stem in files:
            raise ValueError(f"{folder} holds two images named {path.stem!r} ({files[path.stem].name}, {path.name}): "
                             f"images and masks are paired by file name stem")
        files[path.stem] = path
    if not files:
        raise ValueError(f"{folder} holds no image (files ending {', '.join(IMAGE_SUFFIXES)})")
    return files


def find_image_pairs(folder: str | Path, images: str = "rgb", masks: str = "figure_ground") -> list[tuple[Path, Path]]:
    """The (image, mask) files of ``<folder>/<images>/`` and ``<folder>/<masks>/``, paired by file name stem, sorted.

    ValueError (naming up to 5 files) when an image has no mask or a mask no image; FileNotFoundError / ValueError
    when a folder is missing or holds no image.
    """
    folder = Path(folder)
    found = {images: _images_in(folder / images), masks: _images_in(folder / masks)}
    for mine, other in ((images, masks), (masks, images)):
        alone = sorted(set(found[mine]) - set(found[other]))
        if alone:
            names = ", ".join(found[mine][s].name for s in alone[:5]) + (", ..." if len(alone) > 5 else "")
            raise ValueError(f"{len(alone)} file(s) in {folder / mine} have no file of the same name stem in "
                             f"{folder / other}: {names} (every image needs its mask, every mask its image)")
    image_files, mask_files = found[images], found[masks]
    return [(image_files[s], mask_files[s]) for s in sorted(image_files)]


def read_image(path: Path, mode: str) -> torch.Tensor:
    """The image at ``path`` decoded by Pillow as uint8 [C, H, W] (mode "RGB": C = 3, "L": grey, C = 1);
    ValueError naming the file when Pillow cannot read it."""
    try:
        with Image.open(path) as image:
            array = np.asarray(image.convert(mode))
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"{path}: not an image Pillow can read ({type(err).__name__}: {err})") from None
    return torch.from_numpy(array.reshape(*array.shape[:2], -1).copy()).permute(2, 0, 1)


def _resize(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 [C, H, W] -> uint8 [C, height, width], bilinear with antialiasing (an area average when shrinking).
    In uint8 (channels last), torch's antialiased resize is about 100x faster than in float32 on the CPU."""
    image = image[None].contiguous(memory_format=torch.channels_last)
    return F.interpolate(image, size=(height, width), mode="bilinear", antialias=True, align_corners=False)[0]


def _load_pair(image_path: Path, mask_path: Path, height: int, width: int, threshold: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """rgb [3, height, width] in [0, 1] and figure [height, width] bool of one image and its mask: the mask is
    thresholded at its own size, resized like the image, and a pixel is figure where most of it was."""
    rgb, mask = read_image(image_path, "RGB"), read_image(mask_path, "L")
    (h, w), (mh, mw) = rgb.shape[1:], mask.shape[1:]
    if abs((w / h) / (mw / mh) - 1) > ASPECT_TOLERANCE:
        raise ValueError(f"{mask_path} is {mw} x {mh} pixels and its image {image_path} {w} x {h}: their aspect "
                         f"ratios differ by more than {ASPECT_TOLERANCE:.0%}, so the mask does not outline this image")
    figure = _resize((mask >= threshold).to(torch.uint8) * 255, height, width)[0] >= 128
    return _resize(rgb, height, width).float() / 255, figure


def load_segmentation(pairs: list[tuple[Path, Path]], height: int, width: int, hog_cell: int,
                      threshold: int = 128) -> SegmentationImages:
    """Images and masks (``find_image_pairs``) on an h x w grid with their features (``image_features``)."""
    loaded = [_load_pair(image, mask, height, width, threshold) for image, mask in pairs]
    rgb = torch.stack([r for r, _ in loaded])
    y = torch.stack([m for _, m in loaded]).flatten(1).long()
    if not y.any():
        raise ValueError(f"no pixel of the {len(pairs)} masks in {pairs[0][1].parent} is figure (grey level >= "
                         f"threshold {threshold}): masks stored as 0 / 1 need data.threshold=1")
    return SegmentationImages(rgb, unary_features(rgb, hog_cell), pairwise_features(rgb), y, height, width,
                              [image.stem for image, _ in pairs])


class SegmentationDataModule(GridDataModule):
    """Figure/ground segmentation of the colour images under ``root`` (the module docstring's two layouts): every
    image and mask resized to ``height`` x ``width`` (one grid for all; an image of another aspect ratio is
    stretched), Domke's 42 unary and 3 pairwise features (``image_features``, HOG cells of ``hog_cell`` pixels).

    root None: the Weizmann horses in the data cache (``download.horses_dir``). test_fraction: the seeded share of
    the images held out for testing in the ``<images>`` + ``<masks>`` layout (ignored with train/ + test/);
    val_fraction: the seeded share of the training images held out for validation. Batches are ``(GridInputs,
    y [B, n], index [B])``; after ``setup()``, ``train_images`` / ``test_images`` hold the ``SegmentationImages``.
    """

    def __init__(self, root: str | None = None, images: str = "rgb", masks: str = "figure_ground", height: int = 45,
                 width: int = 60, hog_cell: int = 6, threshold: int = 128, test_fraction: float = 0.3,
                 batch_size: int = 16, val_fraction: float = 0.0, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__(batch_size, val_fraction, seed, num_workers, num_states=2)
        self.save_hyperparameters(logger=False)  # train.py logs them apart (data.seed != model.seed)
        for name, v in (("height", height), ("width", width), ("hog_cell", hog_cell)):
            check_int(v, f"data.{name}", 1)
        check_int(threshold, "data.threshold", 1, 255, "an int in [1, 255] (mask grey level from which on a pixel "
                  "is figure)")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"data.test_fraction must lie in (0, 1), got {test_fraction!r}")
        self.root, self.images, self.masks = root, images, masks
        self.options = dict(height=height, width=width, hog_cell=hog_cell, threshold=threshold)
        self.test_fraction = test_fraction
        self.train_images: SegmentationImages | None = None
        self.test_images: SegmentationImages | None = None

    @property
    def learner_inputs(self) -> dict:
        """``GridDataModule``'s, and the unary features that show the image in prediction pictures (RGB: 1, 2, 3)."""
        return {**super().learner_inputs, "picture_features": [1, 2, 3]}

    def _folder(self) -> Path:
        if self.root is None:
            return horses_dir()
        root = Path(self.root).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"data.root={self.root}: {root.resolve()} is not a folder")
        return root

    def _load(self) -> tuple[SegmentationImages, SegmentationImages]:
        root = self._folder()
        if (root / "train").is_dir() or (root / "test").is_dir():
            for split in ("train", "test"):
                if not (root / split).is_dir():
                    raise FileNotFoundError(f"data.root={root} has a {'test' if split == 'train' else 'train'}/ "
                                            f"folder but no {split}/: a fixed split needs both, each with "
                                            f"{self.images}/ and {self.masks}/")
            train, test = (find_image_pairs(root / s, self.images, self.masks) for s in ("train", "test"))
        elif (root / self.images).is_dir() or (root / self.masks).is_dir():
            pairs = find_image_pairs(root, self.images, self.masks)
            if len(pairs) < 2:
                raise ValueError(f"{root} holds {len(pairs)} image: a train/test split needs at least 2")
            tr, te = train_val_indices(len(pairs), self.test_fraction, self.seed)
            train, test = [pairs[i] for i in tr.tolist()], [pairs[i] for i in te.tolist()]
        else:
            raise FileNotFoundError(f"data.root={root} holds neither {self.images}/ + {self.masks}/ nor train/ + "
                                    f"test/ folders (each with {self.images}/ and {self.masks}/)")
        self.train_images, self.test_images = (load_segmentation(p, **self.options) for p in (train, test))
        return self.train_images, self.test_images

