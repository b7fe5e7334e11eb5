"""Data: ARFF / Mulan loading (any Mulan dataset by name, downloaded with checksums), the synthetic
CRANK generator, the synthetic tree-CRF generator of Bradley & Guestrin (2010), and LightningDataModules.

Batches are tuples ``(x [B, D] float32, y [B, L] int64 in {0, 1}, index [B])``; grid data (``data.grid``,
Domke's denoising images; ``data.segmentation``, folders of photographs and their figure/ground masks such as the
Weizmann horses) give ``(GridInputs, y [B, h * w], index [B])``.
"""

from ..folds import fold_assignment, kfold_indices, train_val_indices
from ..inputs import Standardizer
from ..structure import pruefer_decode
from .arff import ArffAttribute, ArffData, load_arff
from .datamodule import MultilabelDataModule, SyntheticDataModule, TreeCRFSyntheticDataModule
from .denoising import DenoisingImages, denoising_images
from .download import (
                       DownloadError,
                       fetch_mulan,
                       fill_cache_from,
                       fill_horses_cache,
                       horses_dir,
                       mulan_cache_dir,
                       mulan_datasets,
)
from .grid import DenoisingDataModule, GridDataModule, GridDataset
from .image_features import hog, pairwise_features, sobel, unary_features
from .mulan import MULAN_URL, MulanData, arff_to_multilabel, load_mulan, load_mulan_splits, read_mulan_labels
from .segmentation import SegmentationDataModule, SegmentationImages, find_image_pairs, load_segmentation
from .synthetic import CrankSynthetic, crank_potentials, crank_synthetic, random_tree, sparse_multilabel
from .tree_crf_synthetic import TreeCRFSynthetic, random_attachment_tree, tree_crf_synthetic

__all__ = [
    "MULAN_URL",
    "ArffAttribute",
    "ArffData",
    "CrankSynthetic",
    "DenoisingDataModule",
    "DenoisingImages",
    "DownloadError",
    "GridDataModule",
    "GridDataset",
    "MulanData",
    "MultilabelDataModule",
    "SegmentationDataModule",
    "SegmentationImages",
    "Standardizer",
    "SyntheticDataModule",
    "TreeCRFSynthetic",
    "TreeCRFSyntheticDataModule",
    "arff_to_multilabel",
    "crank_potentials",
    "crank_synthetic",
    "denoising_images",
    "fetch_mulan",
    "fill_cache_from",
    "fill_horses_cache",
    "find_image_pairs",
    "fold_assignment",
    "hog",
    "horses_dir",
    "kfold_indices",
    "load_arff",
    "load_mulan",
    "load_mulan_splits",
    "load_segmentation",
    "mulan_cache_dir",
    "mulan_datasets",
    "pairwise_features",
    "pruefer_decode",
    "random_attachment_tree",
    "random_tree",
    "read_mulan_labels",
    "sobel",
    "train_val_indices",
    "sparse_multilabel",
    "tree_crf_synthetic",
    "unary_features",
]
