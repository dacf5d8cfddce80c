"""A bundle's ``config.json`` tells the truth: a client built from that file alone (its
``"inputs"``) and ``model.pt2`` scores a data file as ``embcore predict`` does, for fixed
tables (ids folded by the source or by the program) and dynamic tables, Criteo and MovieLens."""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from movielens_files import write_movielens

from embcore.cli.main import main

SMALL = [
    "data.batch_size=32",
    "data.vocab_cap=40",
    "model.embedding_dim=4",
    "model.bottom_mlp=[8]",
    "model.top_mlp=[8]",
    "train.steps=6",
    "train.eval_every=6",
    "train.checkpoint_every=6",
    "train.progress=false",
    "train.plot=false",
]
MODES = [  # (--set, the mode config.json must state)
    (["model.tables=fixed"], "rows"),
    (["model.tables=fixed", "data.raw_ids=true"], "folded"),
    (["model.tables=dynamic"], "keys"),
]


def _criteo_tsv(path: Path, rows: int = 120) -> None:
    rng = np.random.default_rng(1)
    lines = []
    for i in range(rows):
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-2, 90))) for _ in range(13)]
        cats = [
            "" if rng.random() < 0.2 else f"{int(rng.integers(0, 60)) * 7919:08x}"
            for _ in range(26)
        ]
        lines.append("\t".join([str(i % 2), *ints, *cats]))
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- the client: config.json only
def _id(sparse: dict, column: dict, value: int | None) -> int:
    """One column's id from a file's value, by the rule config.json states."""
    if value is None:
        return sparse["missing"]
    rule = sparse["id_from_value"]
    if rule == "value":
        return value
    assert rule == "1 + value % (vocabulary_size - 1) (0 when vocabulary_size is 1)", rule
    vocab = column["vocabulary_size"]
    return 0 if vocab == 1 else 1 + value % (vocab - 1)


def _criteo_client(inputs: dict, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    assert inputs["dense"]["transform"] == "log(1 + max(x, 0)); missing -> 0"
    sparse = inputs["sparse"]
    assert sparse["value"] == {"C1..C26": "int(h, 16) of the hex hash h (at most 7fffffffffffffff)"}
    dense, ids = [], []
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        dense.append([math.log1p(max(int(x), 0)) if x else 0.0 for x in fields[1:14]])
        row = [0] * int(re.fullmatch(r"\(B, (\d+)\) int64", sparse["shape"]).group(1))
        for column, text in zip(sparse["columns"], fields[14:], strict=True):
            (c,) = column["columns"]
            row[c] = _id(sparse, column, int(text, 16) if text else None)
        ids.append(row)
    return torch.tensor(dense, dtype=torch.float32), torch.tensor(ids, dtype=torch.int64)


def _text_key(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _movielens_client(inputs: dict, root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out ratings (the last 20% by time, user, movie), by config.json's words."""
    sparse, values = inputs["sparse"], inputs["sparse"]["value"]
    assert values["zip_prefix"] == "the zip code's first 3 characters (then text_key)"
    assert values["text_key"].startswith("for gender, occupation, zip_prefix: the first 8 bytes")
    edges = json.loads(values["age_bucket"].split("(")[1].split(", age")[0])
    users = {}
    for line in (root / "u.user").read_text().splitlines():
        uid, age, gender, occupation, zip_code = line.split("|")
        users[int(uid)] = (int(age), gender, occupation, zip_code)
    movies = {}
    for line in (root / "u.item").read_text(encoding="latin-1").splitlines():
        fields = line.split("|")
        flags = [g for g, f in enumerate(fields[5:]) if f == "1"]
        movies[int(fields[0])] = (int(fields[2][-4:]) if fields[2] else None, flags)
    ratings = sorted(
        (int(t), int(u), int(m))
        for u, m, _, t in (x.split("\t") for x in (root / "u.data").read_text().splitlines())
    )
    held = ratings[len(ratings) - len(ratings) // 5 :]
    columns = {c["feature"]: c for c in sparse["columns"]}
    dense, ids = [], []
    for time, user, movie in held:
        age, gender, occupation, zip_code = users[user]
        year, genres = movies[movie]
        rated = 1970 + time / 31556952
        dense.append(
            [
                age / 100,
                (year - 1900) / 100 if year else 0.0,
                math.log1p(max(rated - year, 0)) / 5 if year else 0.0,
            ]
        )
        raw = {
            "user_id": user,
            "movie_id": movie,
            "gender": _text_key(gender),
            "occupation": _text_key(occupation),
            "age_bucket": bisect.bisect_right(edges, age),
            "zip_prefix": _text_key(zip_code[:3]) if zip_code else None,
            "release_year": year,
        }
        row = [0] * sum(len(c["columns"]) for c in sparse["columns"])
        for name, value in raw.items():
            row[columns[name]["columns"][0]] = _id(sparse, columns[name], value)
        bag = columns["genres"]
        for i, c in enumerate(bag["columns"]):  # padding is the missing id
            row[c] = _id(sparse, bag, genres[i]) if i < len(genres) else sparse["missing"]
        ids.append(row)
    return torch.tensor(dense, dtype=torch.float32), torch.tensor(ids, dtype=torch.int64)


# ------------------------------------------------------------------------------------ tests
def _train_export(tmp_path: Path, sets: list[str], capsys) -> tuple[Path, dict]:
    run = tmp_path / "run"
    config = ["train", *(x for s in [*SMALL, *sets, f"train.out_dir={run}"] for x in ("--set", s))]
    assert main(config) == 0
    assert main(["export", "--run", str(run), "--format", "pt2"]) == 0
    capsys.readouterr()
    bundle = run / "export"
    return bundle, json.loads((bundle / "config.json").read_text())


def _predict(bundle: Path, where: Path | None, tmp_path: Path, fmt: str) -> np.ndarray:
    out = tmp_path / f"scores-{fmt}.npy"
    args = ["predict", "--bundle", str(bundle), "--format", fmt, "--output", str(out)]
    if fmt != "safetensors":  # this test exported the program itself
        args.append("--trusted-program")
    assert main([*args, *(["--input", str(where)] if where else [])]) == 0
    return np.load(out)


@pytest.mark.slow
@pytest.mark.parametrize(("sets", "mode"), MODES)
def test_a_client_of_config_json_scores_criteo_rows_as_predict(
    tmp_path: Path, sets: list[str], mode: str, capsys
) -> None:
    path = tmp_path / "day.tsv"
    _criteo_tsv(path)
    files = ["data.source=criteo_tsv", f"data.path={path}", f"data.eval_path={path}"]
    bundle, manifest = _train_export(tmp_path, [*files, *sets], capsys)
    inputs = manifest["inputs"]
    assert inputs["sparse"]["ids"] == mode
    assert manifest["programs"]["pt2"]["inputs"]["sparse"].endswith(inputs["sparse"]["meaning"])
    program = torch.export.load(bundle / "model.pt2").module()
    dense, ids = _criteo_client(inputs, path)
    with torch.no_grad():
        client = program(dense, ids).numpy()
    np.testing.assert_array_equal(client, _predict(bundle, path, tmp_path, "pt2"))
    if mode != "keys":
        np.testing.assert_array_equal(client, _predict(bundle, path, tmp_path, "safetensors"))
    other = ids.clone()
    vocab = inputs["sparse"]["columns"][0]["vocabulary_size"]
    with torch.no_grad():
        if mode == "rows":  # an id outside [0, vocabulary_size) raises
            other[0, 0] = vocab
            with pytest.raises(RuntimeError, match="out of range"):
                program(dense[:1], other[:1])
        elif mode == "folded":  # id and id + vocabulary_size share a row
            other[:, 0] += vocab * 12345
            np.testing.assert_array_equal(program(dense, other).numpy(), client)
        else:  # two keys the table never saw both read the zero row
            other[:, 0] = 2**62 + 11
            unknown = program(dense, other).numpy()
            other[:, 0] = -(2**61)
            np.testing.assert_array_equal(program(dense, other).numpy(), unknown)


@pytest.mark.slow
@pytest.mark.parametrize(("sets", "mode"), [MODES[0], MODES[2]])
def test_a_client_of_config_json_scores_movielens_as_predict(
    tmp_path: Path, sets: list[str], mode: str, capsys
) -> None:
    root = tmp_path / "ml"
    write_movielens(root, ratings=200)
    files = ["data.source=movielens", f"data.path={root}", "train.epochs=2"]
    bundle, manifest = _train_export(tmp_path, [*files, *sets], capsys)
    inputs = manifest["inputs"]
    assert inputs["sparse"]["ids"] == mode
    program = torch.export.load(bundle / "model.pt2").module()
    dense, ids = _movielens_client(inputs, root)
    with torch.no_grad():
        client = program(dense, ids).numpy()
    np.testing.assert_allclose(
        client, _predict(bundle, None, tmp_path, "pt2"), rtol=1e-5, atol=1e-6
    )
