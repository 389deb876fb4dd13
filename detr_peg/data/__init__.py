"""Datasets, augmentation and batching."""

from detr_peg.data.padding import pad_images

__all__ = ["pad_images"]
