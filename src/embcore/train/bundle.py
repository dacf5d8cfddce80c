"""The serving bundle: a trained model as plain files that load on any CPU, without pickles.

::

    export/
      tables.safetensors   {feature name: (vocab, dim) float32}: the embedding tables; a
                           dynamic table's (R, dim) rows in ascending key order, and its
                           (R,) int64 keys as "<name>.keys"
      dense.safetensors    the dense weights (bottom MLP, interaction, top MLP)
      config.json          the run's config, the features and tables, how raw rows are
                           preprocessed, and the metrics at export
      model.pt2            with format "pt2" or "aoti": the model as a torch.export program
      model.aoti.pt2       with format "aoti": the same program compiled by AOTInductor

Optimizer slots are left out: serving only looks rows up. The programs run with PyTorch alone
(:mod:`embcore.train.program`); :func:`load_bundle` serves from any of the three forms with
the same scores: by default from the tensor files, with a model embcore builds itself (fixed
or dynamic tables), and from a program file only when told to trust it (a program can run
code it carries).

``config.json`` is the bundle's manifest: it records the sha256 of both tensor files and of
itself, and :func:`load_bundle` checks them before using anything, so a flipped bit, a
truncated file or files of two exports mixed are refused, naming the file. An export is written
into a temporary directory beside ``out_dir`` and renamed into place (replacing a previous
bundle there), so an export killed half-way leaves the previous bundle intact. See
docs/reliability.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from embcore import _atomic
from embcore._files import read_regular
from embcore._fingerprint import IntegrityError, check_sealed, seal, sha256_file
from embcore.errors import UserError
from embcore.models import DLRM
from embcore.train.bundle_dynamic import KEYS, dynamic_model
from embcore.train.config import Config
from embcore.train.contract import (
    input_contract,
    layout_for,
    missing_id,
    source_gives_keys,
    vocab_sizes_for,
)
from embcore.train.model import build_model
from embcore.train.program import FORMATS, PROGRAM_FILES, load_program, write_programs
from embcore.train.resources import check_resources
from embcore.train.run_state import load_checkpoint

__all__ = [
    "FORMATS",
    "ServingModel",
    "checkpoint_model",
    "export_bundle",
    "export_checkpoint",
    "load_bundle",
]

_FORMAT = "embcore-serving-bundle"
_VERSION = 1
_ENGINE = "engine."
_TENSOR_FILES = ("tables.safetensors", "dense.safetensors")


def export_bundle(
    model: DLRM,
    config: Config,
    out_dir: str | os.PathLike,
    extra: dict[str, Any] | None = None,
    fmt: str = "safetensors",
) -> Path:
    """Write ``model`` and its ``config`` as a bundle in ``out_dir`` (created or replaced, as
    a whole: see the module docstring); ``fmt`` ``"pt2"`` adds ``model.pt2``, ``"aoti"`` also
    ``model.aoti.pt2``.

    Raises:
        FileExistsError: ``out_dir`` holds other files than a bundle (nothing is deleted).
        DiskFullError (an OSError): the disk filled up; the previous bundle is left as it was.
    """
    if fmt not in FORMATS:
        raise ValueError(f"export_bundle: format must be one of {list(FORMATS)}, got {fmt!r}")
    final = Path(out_dir)
    _atomic.check_replaceable(final, "config.json")  # before any work
    _atomic.remove_stale(final)
    with _atomic.temp_dir(final) as tmp:
        _write(model, config, tmp.path, extra, fmt)
        _atomic.replace_dir(tmp.path, final, "config.json")
    return final


def _write(model: DLRM, config: Config, out: Path, extra: dict[str, Any] | None, fmt: str) -> None:
    engine = model.engine
    snapshot = engine.snapshot()
    tables = {s.table.name: s.weight.detach().contiguous() for s in snapshot}
    keyed = set()
    for s in snapshot:  # a dynamic table: its rows in ascending key order, and the keys
        if s.keys is not None:
            keyed.add(s.table.name)
            tables[f"{s.table.name}{KEYS}"] = s.keys.contiguous()
    dense = {
        k: v.detach().contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith(_ENGINE)
    }
    for name, tensors in (("tables", tables), ("dense", dense)):
        save_file(tensors, out / f"{name}.safetensors", metadata={"format": _FORMAT})
        os.chmod(out / f"{name}.safetensors", _atomic.file_mode())  # safetensors writes 0600
    seconds = write_programs(model, out, fmt)
    programs = {f: name for f, name in PROGRAM_FILES.items() if (out / name).is_file()}
    for name in programs.values():
        os.chmod(out / name, _atomic.file_mode())
    files = {name: sha256_file(out / name) for name in (*_TENSOR_FILES, *programs.values())}
    inputs = input_contract(config, {t.name: t.vocabulary_size for t in engine.tables})
    sparse = inputs["sparse"]
    signature = {
        "inputs": {
            "dense": inputs["dense"]["shape"],
            "sparse": f"{sparse['shape']}: {sparse['meaning']}",
        },
        "output": inputs["output"],
    }
    manifest = {
        "format": _FORMAT,
        "version": _VERSION,
        "config": config.to_dict(),
        "dense_features": list(inputs["dense"]["columns"]),
        "sparse_features": list(model.sparse_names),
        "tables": {
            t.name: {
                "vocabulary_size": t.vocabulary_size,  # null: dynamic (keys in tables.safetensors)
                "dim": t.dim,
                "combiner": t.combiner,
                **({"rows": int(tables[t.name].shape[0])} if t.name in keyed else {}),
            }
            for t in engine.tables
        },
        "preprocessing": {
            "dense": inputs["dense"]["transform"],
            "categorical": f"value -> {sparse['id_from_value']}; missing -> {sparse['missing']}",
        },
        "inputs": inputs,  # the whole contract (embcore.train.contract)
        **(extra or {}),
        "programs": {f: {"file": name, **signature} for f, name in programs.items()},
        "program_seconds": {k: round(v, 3) for k, v in seconds.items()},
        "files_sha256": files,
    }
    (out / "config.json").write_text(json.dumps(seal(manifest), indent=2) + "\n")


def export_checkpoint(
    checkpoint: str | os.PathLike, out_dir: str | os.PathLike, fmt: str = "safetensors"
) -> Path:
    """Rebuild the model of a training checkpoint and export it (see :func:`export_bundle`)."""
    model, config, extra = checkpoint_model(checkpoint)
    return export_bundle(model, config, out_dir, extra, fmt)


def checkpoint_model(checkpoint: str | os.PathLike) -> tuple[DLRM, Config, dict[str, Any]]:
    """The lookup-only model of a training checkpoint, its config, and the manifest's step,
    checkpoint and final metrics."""
    tensors, meta = load_checkpoint(checkpoint)
    config = Config.from_dict(meta["config"])
    model = build_model(
        config.model,
        vocab_sizes_for(config),
        optimizer=None,
        seed=config.train.seed,
        raw_ids=config.data.raw_ids,
        layout=layout_for(config),
        pad=missing_id(config),
    )
    state = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    # A lookup-only engine has no slots: keep the weights and the step, drop optimizer slots.
    keep = set(model.state_dict())
    model.load_state_dict({k: v for k, v in state.items() if k in keep})
    extra = {"step": meta["step"], "checkpoint": os.fspath(checkpoint)}
    history = meta.get("history", {}).get("eval", [])
    if history:
        extra["metrics"] = {k: v for k, v in history[-1].items() if k != "step"}
    return model, config, extra


class ServingModel:
    """A bundle loaded for scoring on CPU.

    Attributes:
        model: ``(dense, sparse) -> logits``: the DLRM in eval mode with lookup-only tables
            (format "safetensors"), or the bundle's exported or compiled program.
        config: the training run's config.
        manifest: the bundle's ``config.json``.
    """

    def __init__(
        self,
        model: DLRM | Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        config: Config,
        manifest: dict[str, Any],
    ) -> None:
        self.model, self.config, self.manifest = model, config, manifest

    @property
    def vocab_sizes(self) -> list[int]:
        """How many ids each feature takes from a data file: the Criteo cardinalities (or
        MovieLens' table sizes) capped at ``data.vocab_cap``, the sizes of fixed tables."""
        return vocab_sizes_for(self.config)

    @property
    def keys(self) -> bool:
        """Whether the model takes raw 64-bit ids (unfolded) from a data file."""
        return source_gives_keys(self.config)

    @torch.no_grad()
    def __call__(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """``(B,) float32`` click logits of preprocessed rows."""
        return self.model(dense, sparse)


def load_bundle(
    path: str | os.PathLike, fmt: str = "safetensors", *, trusted_program: bool = False
) -> ServingModel:
    """Load a bundle written by :func:`export_bundle`, serving from its safetensors files
    (``fmt`` "safetensors": a model built by embcore from tensors and JSON, every kind of
    table) or its program (``"pt2"``, ``"aoti"``): the scores are the same.

    A program file is code: loading a ``.pt2`` can run what it carries (pickles, Python
    expressions), an AOTInductor package is a shared library. It is loaded only with
    ``trusted_program=True`` (``embcore predict --trusted-program``), for bundles from someone
    you trust; the bundle's checksums detect damage, not tampering (docs/reliability.md).

    Raises:
        UserError (a ValueError): ``fmt`` is a program and ``trusted_program`` is False;
            nothing of the program was read.
        FileNotFoundError: a bundle file is missing.
        ValueError: the files are not an embcore bundle or do not match each other.
        IntegrityError (a ValueError): a file does not match the sha256 in ``config.json``
            (corrupt, truncated, or from another export); the message names the file.
    """
    if fmt not in FORMATS:
        raise ValueError(f"load_bundle: format must be one of {list(FORMATS)}, got {fmt!r}")
    root = Path(path)
    if fmt != "safetensors" and not trusted_program:
        raise UserError(untrusted_program(root / PROGRAM_FILES[fmt]))
    needed = _TENSOR_FILES if fmt == "safetensors" else (PROGRAM_FILES[fmt],)
    for name in ("config.json", *needed):
        if not (root / name).is_file():
            hint = "" if fmt == "safetensors" else f" --format {fmt}"
            raise FileNotFoundError(
                f"{root}: not a serving bundle of format {fmt!r}, {name} is missing (write one "
                f"with embcore export{hint})"
            )
    manifest = _read_manifest(root / "config.json")
    if manifest.get("format") != _FORMAT or manifest.get("version") != _VERSION:
        raise ValueError(
            f"{root}/config.json: expected format {_FORMAT!r} version {_VERSION}, got "
            f"{manifest.get('format')!r} version {manifest.get('version')!r}"
        )
    _check_files(root, manifest, needed)
    if fmt != "safetensors":
        config = Config.from_dict(manifest["config"])
        return ServingModel(load_program(root / needed[0], fmt), config, manifest)
    config = Config.from_dict(manifest["config"])
    check_resources(config)  # a crafted config.json must not size the model past memory
    tables = load_file(root / "tables.safetensors")
    layout = layout_for(config)
    names = layout.sparse_names
    if config.model.tables == "dynamic":  # keys and rows: embcore's serving lookup
        model = dynamic_model(root, config, tables, manifest)
        _load_dense(root, model, load_file(root / "dense.safetensors"))
        return ServingModel(model, config, manifest)
    if sorted(tables) != sorted(names):
        raise ValueError(
            f"{root}/tables.safetensors: expected tables {list(names)}, got {sorted(tables)}"
        )
    vocab = [int(tables[name].shape[0]) for name in names]
    model = build_model(
        config.model,
        vocab,
        optimizer=None,
        seed=0,
        tables=tables,
        raw_ids=config.data.raw_ids,
        layout=layout,
        pad=missing_id(config),
    )
    _load_dense(root, model, load_file(root / "dense.safetensors"))
    model.eval()
    return ServingModel(model, config, manifest)


def untrusted_program(path: Path) -> str:
    """The refusal to load the program file ``path`` without ``--trusted-program``."""
    return (
        f"{path}: not loaded: a program file can run code it carries when loaded (a .pt2's "
        "pickles and expressions, an AOTInductor package's shared library), and the bundle's "
        "checksums do not prove who wrote it; serve from the tensors (--format safetensors, "
        "the default: the same scores), or pass --trusted-program if you trust the bundle"
    )


def _load_dense(root: Path, model: torch.nn.Module, dense: dict[str, torch.Tensor]) -> None:
    want = model.state_dict()
    for key, value in dense.items():  # before any copy: one message naming file and weight
        if key in want and (value.shape != want[key].shape or value.dtype != want[key].dtype):
            raise ValueError(
                f"{root}/dense.safetensors: '{key}' is {value.dtype} {tuple(value.shape)}, the "
                f"model of config.json has {want[key].dtype} {tuple(want[key].shape)}"
            )
    missing, unexpected = model.load_state_dict(dense, strict=False)
    missing = [k for k in missing if not k.startswith(_ENGINE)]
    if missing or unexpected:
        raise ValueError(
            f"{root}/dense.safetensors does not match the model of config.json: missing "
            f"{missing}, unexpected {unexpected}"
        )


def _read_manifest(path: Path) -> dict[str, Any]:
    raw = read_regular(path, 1 << 26)  # a link or a FIFO is refused, not followed
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise IntegrityError(f"{path} is not valid JSON (corrupt or truncated): {error}") from error
    if isinstance(document, dict) and document.get("format") != _FORMAT:
        return document  # not a bundle: the caller says so
    return check_sealed(document, str(path))


def _check_files(root: Path, manifest: dict[str, Any], names: tuple[str, ...]) -> None:
    """Each of the files ``names`` against its sha256 in ``config.json`` (before anything
    parses it)."""
    files = manifest.get("files_sha256")
    if not isinstance(files, dict):
        raise IntegrityError(f"{root}/config.json lists no checksums of the tensor files")
    for name in names:
        if sha256_file(root / name) != files.get(name):
            raise IntegrityError(
                f"{root / name} does not match the sha256 in config.json: the file is corrupt, "
                "truncated or from another export; export the bundle again"
            )
