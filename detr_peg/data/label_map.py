"""Dataset category ids <-> model labels: contiguous (sorted ids become ``0..K-1``) or raw (label is the id,
``num_classes`` the largest id + 1, as the official COCO DETR models). Stored in checkpoints via ``to_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from detr_peg.errors import DataError
from detr_peg.messages import shortened


class LabelMap:
    """Category ids (distinct, non-negative; kept sorted) and names of a dataset, and their model labels.

    ``contiguous``: label ``i`` is the ``i``-th smallest id; otherwise the label is the id. ``num_classes`` is
    ``K`` when contiguous, the largest id + 1 otherwise.
    """

    def __init__(self, *, category_ids: Sequence[int], names: Sequence[str], contiguous: bool = True):
        if len(category_ids) != len(names):
            raise ValueError(f"LabelMap got {len(category_ids)} category ids but {len(names)} names")
        if len(category_ids) == 0:
            raise ValueError("LabelMap needs at least one category")
        pairs = sorted(zip((int(c) for c in category_ids), (str(n) for n in names)))
        ids = [c for c, _ in pairs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"LabelMap category ids must be distinct, got {ids}")
        if ids[0] < 0:
            raise ValueError(f"LabelMap category ids must be non-negative, got {ids[0]}")
        self.contiguous = bool(contiguous)
        self.category_ids: list[int] = ids
        self.names: list[str] = [n for _, n in pairs]
        self._label_of_id = {cid: (index if self.contiguous else cid) for index, cid in enumerate(ids)}
        self.num_classes = len(ids) if self.contiguous else ids[-1] + 1

    @classmethod
    def from_coco_categories(cls, categories: Sequence[Mapping[str, Any]], *, contiguous: bool = True) -> LabelMap:
        """The map of a COCO ``categories`` list (dicts with ``id`` and ``name``)."""
        return cls(
            category_ids=[c["id"] for c in categories],
            names=[c["name"] for c in categories],
            contiguous=contiguous,
        )

    def __len__(self) -> int:
        """The number of categories (not ``num_classes``)."""
        return len(self.category_ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LabelMap):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"LabelMap(num_categories={len(self)}, num_classes={self.num_classes}, contiguous={self.contiguous})"

    def label_of(self, category_id: int) -> int:
        """The model label of a category id; ``KeyError`` if the id is unknown."""
        return self._label_of_id[int(category_id)]

    def has_category(self, category_id: int) -> bool:
        """Whether ``category_id`` is one of the map's categories."""
        return int(category_id) in self._label_of_id

    def category_id_of(self, label: int) -> int:
        """A label's category id; ``KeyError`` outside ``0..num_classes-1`` or for a raw label that is no category."""
        label = int(label)
        if self.contiguous:
            if not 0 <= label < len(self.category_ids):
                raise KeyError(f"label {label} is outside 0..{len(self.category_ids) - 1}")
            return self.category_ids[label]
        if label not in self._label_of_id:
            raise KeyError(f"label {label} is not the id of a category")
        return label

    def name_of(self, label: int) -> str:
        """The category name of a model label (see :meth:`category_id_of`)."""
        category_id = self.category_id_of(label)
        return self.names[self.category_ids.index(category_id)]

    def labels_to_category_ids(self, labels: Tensor | Sequence[int]) -> Tensor:
        """Model labels (any integer dtype, or ints) as ``int64[N]`` category ids on the labels' device.

        A raw map returns the labels themselves, non-category ones included (COCO evaluation ignores them).
        Raises ``ValueError`` for a label outside ``0..num_classes-1``.
        """
        labels = torch.as_tensor(labels, dtype=torch.int64)
        if labels.numel() and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(
                f"labels must lie in 0..{self.num_classes - 1}, got values {labels.min().item()}..{labels.max().item()}"
            )
        if not self.contiguous:
            return labels.clone()
        table = torch.tensor(self.category_ids, dtype=torch.int64, device=labels.device)
        return table[labels]

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (ints, strs, bool, lists) for checkpoints and JSON."""
        return {
            "category_ids": list(self.category_ids),
            "names": list(self.names),
            "contiguous": self.contiguous,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LabelMap:
        """Inverse of :meth:`to_dict`; ``DataError`` if ``data`` lacks a key or holds values of the wrong kind."""
        text = shortened(repr(data), 200)
        try:
            return cls(
                category_ids=list(data["category_ids"]),
                names=list(data["names"]),
                contiguous=bool(data["contiguous"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(
                f"Stored label map {text} is invalid ({err}); it needs "
                "'category_ids', 'names' and 'contiguous' as written by LabelMap.to_dict()."
            ) from err
