"""MovieLens-100k (GroupLens Research) as click-style rows: "will this user rate this movie 4+?"

Reads a directory in GroupLens' ml-100k layout (their ``ml-100k.zip``, or
``scripts/fetch_movielens.sh``)::

    u.data   user id <tab> movie id <tab> rating (1-5) <tab> unix timestamp
    u.user   user id | age | gender | occupation | zip code
    u.item   movie id | title | release date (01-Jan-1995) | video release date | IMDb URL |
             19 genre flags (0/1: unknown, Action, ..., Western)        (ISO-8859-1 text)

The task is fixed so that results compare: label 1 when rating >= 4; the ratings sorted by
``(timestamp, user id, movie id)``; the first 80% (80,000 of ml-100k's 100,000) train, the
last 20% evaluate. Features of a rating (:data:`LAYOUT`):

* categorical, one id each: ``user_id``, ``movie_id`` (the ids of the files), ``gender``,
  ``occupation``, ``zip_prefix`` (its first 3 characters) as :func:`text_key` of the text,
  ``age_bucket`` (0..6: under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+), ``release_year``;
* ``genres``: a bag of up to 6 genre numbers (0..18 in u.item's column order), padded;
* dense: ``age / 100``, ``(release year - 1900) / 100`` and ``log(1 + years between the
  release and the rating) / 5`` (0 where the release date is unknown).

The categorical values come out as raw 64-bit keys (missing and bag padding:
``MISSING_KEY``); :func:`movielens_rows` folds them into fixed tables of
:data:`TABLE_ROWS` as Criteo's hashes are (``1 + key % (rows - 1)``, missing and padding 0).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embcore.data.bad_rows import BadRows
from embcore.data.batch import MISSING_KEY, categorical_ids
from embcore.data.layout import Layout
from embcore.errors import UserError, reading

__all__ = [
    "FILES",
    "GENRES",
    "LAYOUT",
    "TABLE_ROWS",
    "TEXT_FEATURES",
    "MovieLens",
    "movielens_rows",
    "read_movielens",
    "text_key",
]

GENRES: tuple[str, ...] = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance",
    "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip
#: At most this many genres per movie (ml-100k's most).
BAG = 6
AGE_EDGES = (18, 25, 35, 45, 50, 56)
_CATEGORICAL = ("user_id", "movie_id", "gender", "occupation", "age_bucket", "zip_prefix")
LAYOUT = Layout(
    dense_names=("age", "release_year", "movie_age"),
    sparse_names=(*_CATEGORICAL, "release_year", "genres"),
    widths=(1, 1, 1, 1, 1, 1, 1, BAG),
)
#: Features whose values are text, keyed by :func:`text_key`.
TEXT_FEATURES = ("gender", "occupation", "zip_prefix")
#: Rows of each fixed table (before ``data.vocab_cap``): one more than ml-100k's largest id
#: for the numbered features, so that none share a row; the hashed texts have room to spare
#: (in ml-100k, 2 of the 382 zip prefixes share rows, no gender or occupation does).
TABLE_ROWS: tuple[int, ...] = (944, 1683, 1024, 2048, 8, 16384, 128, len(GENRES) + 1)
FILES = ("u.data", "u.user", "u.item")
_YEAR_SECONDS = 31_556_952  # the mean Gregorian year


def text_key(text: str) -> int:
    """A text's 63-bit key: the first 8 bytes of BLAKE2b of its UTF-8 (``digest_size=8``), read
    little-endian, shifted right by one (so keys are >= 0 and never ``MISSING_KEY``)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True)
class MovieLens:
    """Every well-formed rating, in task order (module docstring).

    Attributes:
        dense: ``(N, 3) float32``.
        keys: ``(N, 13) int64`` raw keys, columns as :data:`LAYOUT` (genres: the last 6).
        labels: ``(N,) float32``: 1.0 for a rating >= 4.
        train_rows: the first rows that train (80%); the rest evaluate.
    """

    dense: np.ndarray
    keys: np.ndarray
    labels: np.ndarray
    train_rows: int


def movielens_rows(keys: np.ndarray, vocab_sizes: Sequence[int]) -> np.ndarray:
    """Raw keys (``(N, 13)``) folded into fixed tables of ``vocab_sizes`` (one per feature):
    ``1 + key % (rows - 1)``, missing and bag padding to row 0."""
    per_column = np.repeat(np.asarray(vocab_sizes, dtype=np.int64), LAYOUT.widths)
    return categorical_ids(keys, per_column)


def _fields(line: str, where: str, sep: str, count: int, names: str) -> list[str]:
    fields = line.rstrip("\r\n").split(sep)
    if len(fields) != count:
        raise UserError(
            f"{where}: expected {count} {sep!r}-separated fields ({names}), got {len(fields)}"
        )
    return fields


def _int(text: str, where: str, what: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise UserError(f"{where}: {what} must be an integer in [{low}, {high}], got {text[:40]!r}")
    return value


def _lines(path: str, bad: BadRows, parse, encoding: str = "latin-1") -> dict:
    """``{first field: parsed}`` for the lines of ``path`` that ``parse(line, where)`` takes."""
    rows: dict = {}
    with reading(path, "a file of GroupLens' ml-100k layout"), open(path, encoding=encoding) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                key, value = parse(line, where)
                if key in rows:
                    raise UserError(f"{where}: id {key} occurs twice")
            except UserError as error:
                bad.found(number, str(error))
                continue
            rows[key] = value
    return rows


def _user(line: str, where: str) -> tuple[int, tuple]:
    user, age, gender, occupation, zip_code = _fields(
        line, where, "|", 5, "user id, age, gender, occupation, zip code"
    )
    uid = _int(user, where, "the user id", 0, 2**62)
    years = _int(age, where, "the age", 0, 150)
    if not gender or not occupation:
        raise UserError(f"{where}: gender and occupation must not be empty")
    bucket = int(np.searchsorted(AGE_EDGES, years, side="right"))
    texts = [text_key(t) for t in (gender, occupation)]
    zip_key = text_key(zip_code[:3]) if zip_code else MISSING_KEY
    return uid, (years, texts[0], texts[1], bucket, zip_key)


def _item(line: str, where: str) -> tuple[int, tuple]:
    fields = _fields(line, where, "|", 5 + len(GENRES), "movie id, title, release date, "
                     "video release date, IMDb URL, 19 genre flags")  # fmt: skip
    mid = _int(fields[0], where, "the movie id", 0, 2**62)
    date = fields[2]
    year = (
        _int(date[-4:], where, "the release date's year (01-Jan-1995)", 1800, 2200) if date else 0
    )
    flags = fields[5:]
    if any(flag not in ("0", "1") for flag in flags):
        raise UserError(f"{where}: genre flags must be 0 or 1, got {flags}")
    genres = [g for g, flag in enumerate(flags) if flag == "1"]
    if len(genres) > BAG:
        raise UserError(f"{where}: at most {BAG} genres per movie, got {len(genres)}")
    return mid, (year, genres + [MISSING_KEY] * (BAG - len(genres)))


def read_movielens(
    directory: str | os.PathLike, bad_rows: dict[str, BadRows] | None = None
) -> MovieLens:
    """Read the three files of ``directory`` (module docstring).

    Args:
        directory: holds ``u.data``, ``u.user`` and ``u.item``.
        bad_rows: per file path (``os.path.join(directory, name)``), what a malformed line does
            (default: raise). A skipped user or movie makes its ratings malformed too.

    Raises:
        UserError: a file is missing or unreadable, or a line is malformed (naming the file,
            the line and the value), or no rating is left.
    """
    root = os.fspath(directory)
    if not os.path.isdir(root):
        what = "is a file" if os.path.exists(root) else "no such directory"
        raise UserError(f"[data] path: {root!r} {what}; expected a directory holding {list(FILES)}")
    paths = {name: os.path.join(root, name) for name in FILES}
    for path in paths.values():
        if not os.path.isfile(path):
            raise UserError(f"{path}: missing; a MovieLens directory holds {list(FILES)} (ml-100k)")
    bad = bad_rows or {}
    users = _lines(paths["u.user"], bad.get(paths["u.user"], BadRows()), _user)
    items = _lines(paths["u.item"], bad.get(paths["u.item"], BadRows()), _item)

    def rating(line: str, where: str) -> tuple[int, tuple]:
        fields = _fields(line, where, "\t", 4, "user id, movie id, rating, timestamp")
        user = _int(fields[0], where, "the user id", 0, 2**62)
        movie = _int(fields[1], where, "the movie id", 0, 2**62)
        stars = _int(fields[2], where, "the rating", 1, 5)
        time = _int(fields[3], where, "the timestamp", 0, 2**40)
        if user not in users or movie not in items:
            missing = f"user {user} is not in u.user" if user not in users else ""
            missing = missing or f"movie {movie} is not in u.item"
            raise UserError(f"{where}: {missing}")
        return int(where.rpartition(":")[2]), (time, user, movie, stars)

    ratings = _lines(paths["u.data"], bad.get(paths["u.data"], BadRows()), rating).values()
    if not ratings:
        raise UserError(f"{paths['u.data']}: holds no well-formed rating")
    time, user, movie, stars = (np.array(c, dtype=np.int64) for c in zip(*ratings, strict=True))
    order = np.lexsort((movie, user, time))
    time, user, movie, stars = time[order], user[order], movie[order], stars[order]
    u = [users[int(i)] for i in user]
    m = [items[int(i)] for i in movie]
    age = np.array([x[0] for x in u], dtype=np.float64)
    year = np.array([x[0] for x in m], dtype=np.int64)
    known = year > 0
    rated = 1970.0 + time / _YEAR_SECONDS
    dense = np.stack(
        [
            age / 100.0,
            np.where(known, (year - 1900) / 100.0, 0.0),
            np.where(known, np.log1p(np.maximum(rated - year, 0.0)) / 5.0, 0.0),
        ],
        1,
    ).astype(np.float32)
    one = np.stack(
        [
            user,
            movie,
            *(np.array([x[k] for x in u], dtype=np.int64) for k in (1, 2, 3, 4)),  # gender..zip
            np.where(known, year, MISSING_KEY),
        ],
        1,
    )
    genres = np.array([x[1] for x in m], dtype=np.int64).reshape(-1, BAG)
    keys = np.concatenate([one, genres], 1)
    labels = (stars >= 4).astype(np.float32)
    return MovieLens(dense, keys, labels, train_rows=len(labels) - len(labels) // 5)
