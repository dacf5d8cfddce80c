"""The MovieLens reader on small files in GroupLens' ml-100k layout, made here."""

from __future__ import annotations

import bisect
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
from movielens_files import write_movielens

from embcore.data.bad_rows import BadRows
from embcore.data.movielens import TABLE_ROWS, movielens_rows, read_movielens, text_key
from embcore.errors import UserError


def _key(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _reference(files) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each rating's features, row by row, from the written values (module docstring of
    embcore.data.movielens)."""
    dense, keys, labels = [], [], []
    for user, movie, stars, time in sorted(files.ratings, key=lambda r: (r[3], r[0], r[1])):
        age, gender, occupation, zip_code = files.users[user]
        date, flags = files.movies[movie]
        year = int(date[-4:]) if date else None
        rated = 1970 + time / 31_556_952
        dense.append(
            [
                age / 100,
                (year - 1900) / 100 if year else 0.0,
                math.log1p(max(rated - year, 0)) / 5 if year else 0.0,
            ]
        )
        genres = [g for g, f in enumerate(flags) if f]
        keys.append(
            [
                user,
                movie,
                _key(gender),
                _key(occupation),
                bisect.bisect_right([18, 25, 35, 45, 50, 56], age),
                _key(zip_code[:3]) if zip_code else -1,
                year if year else -1,
                *genres,
                *[-1] * (6 - len(genres)),
            ]
        )
        labels.append(float(stars >= 4))
    return np.array(dense), np.array(keys, dtype=np.int64), np.array(labels)


def test_rows_match_an_independent_reading(tmp_path: Path) -> None:
    files = write_movielens(tmp_path, ratings=250)
    data = read_movielens(tmp_path)
    dense, keys, labels = _reference(files)
    np.testing.assert_array_equal(data.keys, keys)
    np.testing.assert_allclose(data.dense, dense, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(data.labels, labels)
    assert data.train_rows == 200  # the first 80% train
    assert text_key("M") == _key("M")


def test_fixed_tables_fold_keys_and_keep_padding_in_row_0(tmp_path: Path) -> None:
    write_movielens(tmp_path, ratings=60)
    keys = read_movielens(tmp_path).keys
    rows = movielens_rows(keys, TABLE_ROWS)
    per_column = np.repeat(TABLE_ROWS, [1, 1, 1, 1, 1, 1, 1, 6])
    expected = np.where(keys < 0, 0, 1 + keys % (per_column - 1))
    np.testing.assert_array_equal(rows, expected)
    assert (rows < per_column).all() and (rows[:, -6:][keys[:, -6:] < 0] == 0).all()


@pytest.mark.parametrize(
    ("name", "line", "message"),
    [
        ("u.data", "1\t2\t3\n", r"u\.data:301: expected 4 '\\t'-separated fields"),
        ("u.data", "1\t2\t9\t880000000\n", r"u\.data:301: the rating must be an integer in \[1, 5\], got '9'"),  # noqa: E501
        ("u.data", "99\t2\t3\t880000000\n", r"u\.data:301: user 99 is not in u\.user"),
        ("u.user", "21|x|M|writer|55455\n", r"u\.user:21: the age must be an integer"),
        ("u.item", "31|T|01-Jan-1990||u|" + "|".join("2" * 19) + "\n", r"u\.item:31: genre flags must be 0 or 1"),  # noqa: E501
        ("u.item", "1|T|01-Jan-1990||u|" + "|".join("0" * 19) + "\n", r"u\.item:31: id 1 occurs twice"),  # noqa: E501
    ],
)  # fmt: skip
def test_a_malformed_line_names_file_and_line(
    tmp_path: Path, name: str, line: str, message: str
) -> None:
    write_movielens(tmp_path, ratings=300)
    with open(tmp_path / name, "a") as f:
        f.write(line)
    with pytest.raises(UserError, match=message):
        read_movielens(tmp_path)


def test_skipping_counts_bad_lines_and_the_ratings_they_orphan(tmp_path: Path) -> None:
    files = write_movielens(tmp_path, ratings=100)
    clean = read_movielens(tmp_path)
    with open(tmp_path / "u.data", "a") as f:
        f.write("1\t2\tthree\t880000000\n\n1\t2\n")  # two bad lines, one blank
    lines = (tmp_path / "u.user").read_text().splitlines(keepends=True)
    lines[2] = "3|old|M|writer|55455\n"  # user 3 unreadable: their ratings are orphans
    (tmp_path / "u.user").write_text("".join(lines))
    bad = {str(tmp_path / n): BadRows(skip=True) for n in ("u.data", "u.user", "u.item")}
    data = read_movielens(tmp_path, bad)
    orphans = sum(1 for r in files.ratings if r[0] == 3)
    assert bad[str(tmp_path / "u.user")].count == 1
    assert bad[str(tmp_path / "u.data")].count == 2 + orphans
    assert len(data.labels) == len(clean.labels) - orphans
    kept = clean.keys[:, 0] != 3
    np.testing.assert_array_equal(data.keys, clean.keys[kept])


def test_missing_directory_or_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such directory"):
        read_movielens(tmp_path / "nope")
    write_movielens(tmp_path, ratings=20)
    (tmp_path / "u.item").unlink()
    with pytest.raises(UserError, match=r"u\.item: missing; a MovieLens directory holds"):
        read_movielens(tmp_path)
