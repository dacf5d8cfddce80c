"""What a run's model takes as input, for every source, table kind and id mode.

The id mode follows from ``model.tables`` and ``data.raw_ids`` alone, the same for every
source:

=========  =====================  ========================================================
mode       when                   the ``sparse`` input's ids
=========  =====================  ========================================================
rows       fixed, raw_ids false   table rows in ``[0, vocabulary_size)``: the source folds
                                  each value into its table (``1 + v % (rows - 1)``,
                                  missing -> 0)
folded     fixed, raw_ids true    any int64: the source's raw ids (missing ->
                                  ``MISSING_KEY`` = -1); the model folds ``id mod rows``
keys       dynamic                any int64 key, never folded (missing -> -1); a key the
                                  table has no row for reads the zero row
=========  =====================  ========================================================

A value of a file is the integer of its hex hash (Criteo TSV and Parquet) or, for MovieLens,
the id of its files or :func:`~embcore.data.movielens.text_key` of a text. The synthetic
source's ids are its rows (``raw_ids`` mixes them into 64-bit values first).

:func:`input_contract` writes all of it into a serving bundle's ``config.json`` so that a client
can be built from that file alone (tests/train/test_bundle_contract.py does).
"""

from __future__ import annotations

from typing import Any

from embcore.data.batch import MISSING_KEY, capped_vocab_sizes
from embcore.data.layout import CRITEO_LAYOUT, Layout
from embcore.data.movielens import AGE_EDGES, BAG, GENRES, TABLE_ROWS, TEXT_FEATURES
from embcore.data.movielens import LAYOUT as MOVIELENS_LAYOUT
from embcore.train.config import Config

__all__ = [
    "describe_ids",
    "id_mode",
    "input_contract",
    "layout_for",
    "missing_id",
    "source_gives_keys",
    "vocab_sizes_for",
]


def id_mode(config: Config) -> str:
    """``"rows"``, ``"folded"`` or ``"keys"`` (module docstring)."""
    if config.model.tables == "dynamic":
        return "keys"
    return "folded" if config.data.raw_ids else "rows"


def source_gives_keys(config: Config) -> bool:
    """Whether the source hands raw ids (unfolded) to the model: every mode but ``rows``;
    the synthetic source's ids are its rows unless ``raw_ids`` mixes them."""
    if config.data.source == "synthetic":
        return config.data.raw_ids
    return id_mode(config) != "rows"


def missing_id(config: Config) -> int:
    """The id of a missing value (and a bag's padding): row 0, or ``MISSING_KEY``."""
    return MISSING_KEY if source_gives_keys(config) else 0


def layout_for(config: Config) -> Layout:
    """The columns of the run's batches."""
    return MOVIELENS_LAYOUT if config.data.source == "movielens" else CRITEO_LAYOUT


def vocab_sizes_for(config: Config) -> list[int]:
    """The fixed tables' rows: Criteo's cardinalities (or MovieLens' table sizes) capped at
    ``data.vocab_cap``."""
    if config.data.source == "movielens":
        return capped_vocab_sizes(config.data.vocab_cap, TABLE_ROWS)
    return capped_vocab_sizes(config.data.vocab_cap)


def describe_ids(config: Config) -> str:
    """One line for the run's log: how ids reach the tables."""
    mode = id_mode(config)
    if mode == "keys":
        return "ids: raw 64-bit keys, a row per id (dynamic tables, never folded)"
    if mode == "folded":
        return "ids: raw 64-bit ids folded into fixed tables as id mod rows (data.raw_ids)"
    if config.data.source == "synthetic":
        return "ids: table rows (fixed tables)"
    return "ids: values folded into fixed tables as 1 + value % (rows - 1), missing -> row 0"


_MEANING = {
    "rows": "table rows in [0, vocabulary_size) of the column's table; an id outside raises",
    "folded": "any int64 raw id; the program folds it into the column's table as id mod "
    "vocabulary_size (floored: negative ids too), colliding ids share a row",
    "keys": "any int64 key; a key the table holds no row for reads the zero row (the "
    "bundle's keys are in tables.safetensors as <table>.keys)",
}


def _values(config: Config) -> dict[str, Any]:
    """How a source's raw values become the ``value`` of a column."""
    if config.data.source == "movielens":
        return {
            "user_id, movie_id": "the integer id of u.data",
            "text_key": "for " + ", ".join(TEXT_FEATURES) + ": the first 8 bytes of "
            "hashlib.blake2b(text.encode('utf-8'), digest_size=8) read little-endian, >> 1",
            "zip_prefix": "the zip code's first 3 characters (then text_key)",
            "age_bucket": f"bisect_right({list(AGE_EDGES)}, age): 0..{len(AGE_EDGES)}",
            "release_year": "the year of u.item's release date (missing if none)",
            "genres": f"the numbers (0..{len(GENRES) - 1}) of the movie's genres in u.item's "
            f"column order {list(GENRES)}, up to {BAG}, then padding",
        }
    if config.data.source == "synthetic":
        mixed = "SplitMix64's finalizer of id + 2**40 * column (data.raw_ids)"
        return {"synthetic": mixed if config.data.raw_ids else "the synthetic ids"}
    return {"C1..C26": "int(h, 16) of the hex hash h (at most 7fffffffffffffff)"}


def input_contract(config: Config, tables: dict[str, int | None]) -> dict[str, Any]:
    """The ``"inputs"`` of a bundle's ``config.json``: the program's ``dense`` and ``sparse``
    inputs, and how a source's rows become them.

    Args:
        config: the run's config.
        tables: ``vocabulary_size`` per feature (None for a dynamic table).
    """
    layout, mode = layout_for(config), id_mode(config)
    missing = missing_id(config)
    columns = []
    for name, start, width in layout.spans():
        column = {"feature": name, "table": name, "vocabulary_size": tables[name]}
        column["columns"] = list(range(start, start + width))
        if width > 1:
            column["bag"] = f"up to {width} ids padded with {missing}; the table's rows of the "
            column["bag"] += "ids that are not padding are averaged (zeros when none)"
        columns.append(column)
    if config.data.source == "movielens":
        dense = "age / 100; (release year - 1900) / 100; log(1 + max(rating year - release "
        dense += "year, 0)) / 5, rating year = 1970 + timestamp / 31556952; unknown year -> 0"
    else:
        dense = "log(1 + max(x, 0)); missing -> 0"
    gives_keys = source_gives_keys(config)
    if gives_keys:
        to_id = "value"
    elif config.data.source == "synthetic":
        to_id = "the synthetic ids are table rows"
    else:
        to_id = "1 + value % (vocabulary_size - 1) (0 when vocabulary_size is 1)"
    return {
        "dense": {
            "shape": f"(B, {len(layout.dense_names)}) float32",
            "columns": list(layout.dense_names),
            "transform": dense,
        },
        "sparse": {
            "shape": f"(B, {layout.columns}) int64",
            "ids": mode,
            "meaning": _MEANING[mode],
            "columns": columns,
            "missing": missing,
            "value": _values(config),
            "id_from_value": to_id,
        },
        "output": "(B,) float32 logits: P(label 1) = sigmoid(logit)",
    }
