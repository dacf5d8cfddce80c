"""What the columns of a source's batches are: dense features, categorical features and bags.

A :class:`~embcore.data.batch.Batch` holds ``dense (B, D)`` floats and ``sparse (B, S)`` ids.
The layout names them: dense column ``j`` is ``dense_names[j]``; categorical feature ``f``
(one embedding table each) takes ``widths[f]`` consecutive columns of ``sparse``: one id
(width 1), or a bag of up to ``width`` ids padded with the source's padding id (the table's
rows are averaged over the bag's ids: a multi-hot feature such as a movie's genres)::

    Criteo:     dense I1..I13              sparse C1..C26, one id each
    MovieLens:  dense age, year, ...       sparse user_id, movie_id, ..., genres (6 columns)
"""

from __future__ import annotations

from dataclasses import dataclass

from embcore.data.batch import DENSE_NAMES, SPARSE_NAMES

__all__ = ["CRITEO_LAYOUT", "Layout"]


@dataclass(frozen=True)
class Layout:
    """The columns of a source's batches (module docstring).

    Attributes:
        dense_names: one per dense column.
        sparse_names: one per categorical feature, in column order.
        widths: columns of ``sparse`` per feature: 1 (one id) or the size of its bag.
    """

    dense_names: tuple[str, ...]
    sparse_names: tuple[str, ...]
    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.widths) != len(self.sparse_names) or any(w < 1 for w in self.widths):
            raise ValueError(
                f"Layout: widths must be one int >= 1 per feature of {list(self.sparse_names)}, "
                f"got {list(self.widths)}"
            )

    @property
    def columns(self) -> int:
        """``S``: the columns of ``sparse``."""
        return sum(self.widths)

    @property
    def bags(self) -> bool:
        """Whether some feature is a bag (more than one column)."""
        return any(w > 1 for w in self.widths)

    def spans(self) -> list[tuple[str, int, int]]:
        """``(feature, first column, width)`` per feature."""
        spans, start = [], 0
        for name, width in zip(self.sparse_names, self.widths, strict=True):
            spans.append((name, start, width))
            start += width
        return spans


#: Criteo rows: 13 count features, 26 categorical features of one id each.
CRITEO_LAYOUT = Layout(DENSE_NAMES, SPARSE_NAMES, (1,) * len(SPARSE_NAMES))
