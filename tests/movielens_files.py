"""Small MovieLens directories in GroupLens' ml-100k layout, made by the tests (never the real
data): seeded users, movies and ratings written as u.user, u.item and u.data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

OCCUPATIONS = ("engineer", "student", "writer", "other", "artist")


@dataclass
class Files:
    """What was written: ``users[id] = (age, gender, occupation, zip)``,
    ``movies[id] = (release date, genre flags)``, ``ratings = [(user, movie, stars, time)]``."""

    root: Path
    users: dict[int, tuple[int, str, str, str]]
    movies: dict[int, tuple[str, list[int]]]
    ratings: list[tuple[int, int, int, int]]


def write_movielens(
    root: Path, users: int = 20, movies: int = 30, ratings: int = 300, seed: int = 0
) -> Files:
    """Write a directory of ``ratings`` ratings by ``users`` users of ``movies`` movies."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    people = {}
    for uid in range(1, users + 1):
        age = int(rng.integers(12, 70))
        gender = "MF"[int(rng.integers(2))]
        occupation = OCCUPATIONS[int(rng.integers(len(OCCUPATIONS)))]
        zip_code = ["55455", "94043", "T8H1N", "10003", ""][int(rng.integers(5))]
        people[uid] = (age, gender, occupation, zip_code)
    films = {}
    for mid in range(1, movies + 1):
        date = "" if mid == movies else f"01-Jan-{int(rng.integers(1930, 1998))}"
        flags = [0] * 19
        for g in rng.choice(19, size=int(rng.integers(1, 4)), replace=False):
            flags[int(g)] = 1
        films[mid] = (date, flags)
    rows = []
    seen = set()
    while len(rows) < ratings:
        user, movie = int(rng.integers(1, users + 1)), int(rng.integers(1, movies + 1))
        if (user, movie) in seen:
            continue
        seen.add((user, movie))
        # a few equal timestamps, so that the sort's tie-break on (user, movie) matters
        rows.append((user, movie, int(rng.integers(1, 6)), 880_000_000 + int(rng.integers(0, 50))))
    (root / "u.user").write_text(
        "".join(f"{u}|{a}|{g}|{o}|{z}\n" for u, (a, g, o, z) in people.items())
    )
    (root / "u.item").write_text(
        "".join(
            f"{m}|Movie {m} (1990)|{d}||http://example.org/{m}|" + "|".join(map(str, f)) + "\n"
            for m, (d, f) in films.items()
        ),
        encoding="latin-1",
    )
    (root / "u.data").write_text("".join(f"{u}\t{m}\t{r}\t{t}\n" for u, m, r, t in rows))
    return Files(root, people, films, rows)
