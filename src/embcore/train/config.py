"""The main job's configuration: four frozen sections, read from TOML and ``--set`` overrides.

A file holds any subset of the sections; every key not given keeps its default::

    [data]                  # where rows come from
    source = "synthetic"    # or "criteo_tsv", "parquet", "movielens"
    [model]                 # DLRM sizes
    [optim]                 # embedding and dense optimizers
    [train]                 # steps, evaluation, checkpoints, output

``--set section.key=value`` overrides one key; the value is read as a TOML value (``3``,
``0.5``, ``true``, ``[64, 16]``, ``"text"``) and, when it is not valid TOML, as a plain string,
so ``--set data.path=day_0.tsv.gz`` works.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from embcore.errors import UserError, reading

__all__ = [
    "LOCATION_ONLY",
    "RESUMABLE_CHANGES",
    "Config",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "load_config",
    "parse_override",
]

SOURCES = ("synthetic", "criteo_tsv", "parquet", "movielens")
INTERACTION_NAMES = ("dot", "dcn")
EMBEDDING_OPTIMIZERS = ("adagrad", "rowwise_adagrad", "sgd")


class _Section:
    """Shared validation: coerce each field to its annotated type, then ``_check`` ranges."""

    _name: typing.ClassVar[str]

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = _coerce(f"[{self._name}] {f.name}", hints[f.name], getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self._check()

    def _check(self) -> None:
        pass

    def _require(self, ok: bool, name: str, expected: str) -> None:
        if not ok:
            raise UserError(
                f"[{self._name}] {name} must be {expected}, got {getattr(self, name)!r}"
            )


def _coerce(where: str, hint: Any, value: Any) -> Any:
    """``value`` as the annotated type, or a ValueError naming the key, the value and the type."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise UserError(f"{where} must be one of {list(choices)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where} must be a list of ints, got {value!r}")
        return tuple(_coerce(where, int, v) for v in value)
    if hint is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise UserError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise UserError(f"{where} must be a string, got {value!r}")
        return value
    raise TypeError(f"{where}: unsupported config type {hint!r}")  # a bug in this module


@dataclass(frozen=True, kw_only=True)
class DataConfig(_Section):
    """Where rows come from.

    Attributes:
        source: ``synthetic`` (built in), ``criteo_tsv`` or ``parquet`` (files), ``movielens``
            (a directory in GroupLens' ml-100k layout: docs/main_job.md, "MovieLens").
        path: the training file of a file source; the directory of ``movielens``.
        eval_path: the held-out file of a file source (required there; not for movielens,
            whose last 20% of ratings are held out).
        eval_rows: held-out rows: the synthetic eval set's size; for files and movielens, the
            first held-out rows to use (0: all).
        batch_size: rows per training step.
        vocab_cap: tables have ``min(Criteo cardinality, vocab_cap)`` rows.
        seed: the synthetic source's seed (its hidden model and every row).
        zipf_a: Zipf exponent of the synthetic ids.
        hot_ids: synthetic ids far above this carry little signal.
        bad_rows: what a malformed row of a file source does: ``raise`` (stop, naming the file
            and line) or ``skip`` (count it, report the count at the end and in
            ``summary.json``).
        raw_ids: every source gives its categorical values as raw 64-bit ids, unfolded (files:
            the hashes; movielens: its keys; synthetic: each id mixed through a 64-bit hash):
            fixed tables fold them as ``id mod rows``. Dynamic tables
            (``model.tables = "dynamic"``) always key the raw ids, never folded
            (:mod:`embcore.train.contract`).
    """

    _name = "data"
    source: typing.Literal["synthetic", "criteo_tsv", "parquet", "movielens"] = "synthetic"
    path: str = ""
    eval_path: str = ""
    eval_rows: int = 65_536
    batch_size: int = 2048
    vocab_cap: int = 100_000
    seed: int = 0
    zipf_a: float = 1.1
    hot_ids: float = 30.0
    bad_rows: typing.Literal["raise", "skip"] = "raise"
    raw_ids: bool = False

    def _check(self) -> None:
        self._require(self.eval_rows >= 0, "eval_rows", "an int >= 0")
        self._require(self.batch_size >= 1, "batch_size", "an int >= 1")
        self._require(self.vocab_cap >= 2, "vocab_cap", "an int >= 2")
        self._require(self.seed >= 0, "seed", "an int >= 0")
        self._require(self.zipf_a > 1.0, "zipf_a", "a number > 1")
        self._require(self.hot_ids > 0, "hot_ids", "a number > 0")
        if self.source == "synthetic":
            self._require(self.eval_rows >= 1, "eval_rows", "an int >= 1 for synthetic data")
        elif self.source == "movielens":
            self._require(bool(self.path), "path", "a directory for source='movielens'")
        else:
            for name in ("path", "eval_path"):
                self._require(
                    bool(getattr(self, name)), name, f"a file path for source={self.source!r}"
                )


@dataclass(frozen=True, kw_only=True)
class ModelConfig(_Section):
    """DLRM sizes.

    Attributes:
        interaction: ``dot`` (DLRM) or ``dcn`` (DCN-v2 cross layers).
        embedding_dim: width of every table row (and of the bottom MLP's output).
        bottom_mlp: hidden sizes of the bottom MLP (its output size is ``embedding_dim``).
        top_mlp: hidden sizes of the top MLP (a final layer of size 1 is added).
        dcn_layers: cross layers of the ``dcn`` interaction.
        dcn_rank: rank of each cross layer's weight (0: full rank).
        embedding_init: rows start uniform in ``[-embedding_init, embedding_init]``.
        tables: ``fixed``: one table of ``min(cardinality, data.vocab_cap)`` rows per
            feature; ``dynamic``: dynamic tables (docs/dynamic_tables.md) that give every id
            its own row, a new row starting from the engine's default initializer, a pure
            function of ``(train.seed, feature, id)`` (``embedding_init`` is for fixed tables).
        min_count: dynamic tables admit an id once it occurred this often in training.
        steps_to_live: dynamic tables drop an id's row after this many steps without it
            (0: never).
        max_rows: dynamic tables keep at most this many rows each, the least frequently used
            go first (0: no limit).
        initial_capacity: dynamic tables reserve memory for this many keys each when the
            engine is built (``TableConfig(initial_capacity=...)``: no growth and no first
            touch of fresh memory in the training steps until then; the same results); 0: none.
            Only with ``tables = "dynamic"``.
        storage: ``memory``, or ``disk``: the tables in ``DiskStorage`` under the run's
            ``out_dir/rows``, behind one RAM cache of ``cache_bytes`` (docs/disk_tables.md).
        cache_bytes: the disk tables' cache.
    """

    _name = "model"
    interaction: typing.Literal["dot", "dcn"] = "dot"
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (64,)
    top_mlp: tuple[int, ...] = (256, 128)
    dcn_layers: int = 3
    dcn_rank: int = 64
    embedding_init: float = 0.025
    tables: typing.Literal["fixed", "dynamic"] = "fixed"
    min_count: int = 1
    steps_to_live: int = 0
    max_rows: int = 0
    initial_capacity: int = 0
    storage: typing.Literal["memory", "disk"] = "memory"
    cache_bytes: int = 64 << 20

    def _check(self) -> None:
        self._require(self.embedding_dim >= 1, "embedding_dim", "an int >= 1")
        self._require(self.cache_bytes >= 1, "cache_bytes", "an int >= 1")
        self._require(self.min_count >= 1, "min_count", "an int >= 1")
        self._require(self.steps_to_live >= 0, "steps_to_live", "an int >= 0 (0: never)")
        self._require(self.max_rows >= 0, "max_rows", "an int >= 0 (0: no limit)")
        self._require(self.initial_capacity >= 0, "initial_capacity", "an int >= 0 (0: none)")
        if self.initial_capacity and self.tables != "dynamic":
            raise UserError(
                f"[model] initial_capacity = {self.initial_capacity} reserves keys of dynamic "
                f'tables, but tables = "{self.tables}"; set tables = "dynamic" or leave '
                "initial_capacity at 0"
            )
        for name in ("bottom_mlp", "top_mlp"):
            self._require(all(n >= 1 for n in getattr(self, name)), name, "sizes >= 1")
        self._require(self.dcn_layers >= 1, "dcn_layers", "an int >= 1")
        self._require(self.dcn_rank >= 0, "dcn_rank", "an int >= 0")
        self._require(self.embedding_init >= 0, "embedding_init", "a number >= 0")


@dataclass(frozen=True, kw_only=True)
class OptimConfig(_Section):
    """The two optimizers: the engine's for the tables, Adam for the dense weights.

    Attributes:
        embedding_optimizer: ``adagrad``, ``rowwise_adagrad`` or ``sgd`` (the engine's).
        embedding_lr: the engine optimizer's learning rate.
        initial_accumulator: Adagrad's starting accumulator value.
        dense_lr: Adam's peak learning rate.
        warmup_steps: Adam's rate grows linearly from 0 over these steps.
        decay_to: fraction of ``dense_lr`` reached at the last step (cosine decay); 1 = none.
    """

    _name = "optim"
    embedding_optimizer: typing.Literal["adagrad", "rowwise_adagrad", "sgd"] = "adagrad"
    embedding_lr: float = 0.3
    initial_accumulator: float = 1e-3
    dense_lr: float = 0.01
    warmup_steps: int = 50
    decay_to: float = 0.1

    def _check(self) -> None:
        self._require(self.embedding_lr > 0, "embedding_lr", "a number > 0")
        self._require(self.initial_accumulator > 0, "initial_accumulator", "a number > 0")
        self._require(self.dense_lr > 0, "dense_lr", "a number > 0")
        self._require(self.warmup_steps >= 0, "warmup_steps", "an int >= 0")
        self._require(0 <= self.decay_to <= 1, "decay_to", "a number in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class RunConfig(_Section):
    """The run: its length, evaluation, checkpoints and outputs (the ``[train]`` section).

    Attributes:
        steps: training steps.
        epochs: passes over a finite data set (``data.source = "movielens"``): the run trains
            ``epochs`` times its batches per epoch, reshuffled each epoch, and evaluates after
            each epoch, whatever ``steps`` and ``eval_every`` say; 0: 4 for movielens.
            Other sources stream without end: ``steps`` decides.
        eval_every: evaluate on the held-out rows every this many steps (and at the end).
        log_every: one point of the training-loss curve per this many steps.
        checkpoint_every: write a checkpoint every this many steps (and at the end).
        keep_checkpoints: how many recent checkpoints to keep.
        out_dir: where checkpoints, curves and the summary go.
        seed: seeds the model's initial weights.
        threads: PyTorch threads (0: PyTorch's default). One thread for the small matrices
            of this model, the other core prepares the next batches.
        progress: show progress (a bar on a terminal, one line at a time otherwise).
        plot: write ``curves.png``.
        pipeline: the engine's pipelined execution (docs/semantics.md §4.5): step N's
            embedding update lands after step N+1's lookup, so lookups read one-step-stale
            rows; changes results slightly (see docs/pipelining_and_stats.md).
        compile: run the model through ``torch.compile`` (Inductor; the engine's lookup and
            update as ``torch.ops.embcore`` operators): the same losses up to float32
            rounding; the first step compiles (see docs/main_job.md, "torch.compile").
    """

    _name = "train"
    steps: int = 1000
    epochs: int = 0
    eval_every: int = 200
    log_every: int = 20
    checkpoint_every: int = 250
    keep_checkpoints: int = 2
    out_dir: str = "runs/dlrm"
    seed: int = 0
    threads: int = 1
    progress: bool = True
    plot: bool = True
    pipeline: bool = False
    compile: bool = False

    def _check(self) -> None:
        for name in ("steps", "eval_every", "log_every", "checkpoint_every", "keep_checkpoints"):
            self._require(getattr(self, name) >= 1, name, "an int >= 1")
        self._require(self.epochs >= 0, "epochs", "an int >= 0")
        self._require(bool(self.out_dir), "out_dir", "a directory path")
        self._require(self.seed >= 0, "seed", "an int >= 0")
        self._require(self.threads >= 0, "threads", "an int >= 0")


_SECTIONS: dict[str, type[_Section]] = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "train": RunConfig,
}

#: Keys that may differ between a checkpoint's config and the resumed run's: they do not
#: change what is computed, only how long it runs and what is shown or kept.
RESUMABLE_CHANGES = (
    "train.steps",
    "train.epochs",
    "train.progress",
    "train.plot",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.threads",
)

#: Keys that say where a run's files are, not what the run computes: a run resumed from another
#: working directory, moved to another disk or copied to branch from it is the same run. A
#: changed data path is trusted to hold the same rows (the resumed run says so).
LOCATION_ONLY = ("train.out_dir", "data.path", "data.eval_path")


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole job: ``data``, ``model``, ``optim`` and ``train`` sections."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain JSON/TOML-ready values (tuples become lists)."""
        return {
            name: {
                k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(getattr(self, name)).items()
            }
            for name in _SECTIONS
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        """Build from nested dicts; unknown sections or keys raise, naming the valid ones."""
        if not isinstance(values, dict):
            raise UserError(f"config: expected a table of sections, got {type(values).__name__}")
        unknown = sorted(set(values) - set(_SECTIONS))
        if unknown:
            raise UserError(f"config: unknown sections {unknown}; valid: {list(_SECTIONS)}")
        sections = {}
        for name, section in _SECTIONS.items():
            given = values.get(name, {})
            if not isinstance(given, dict):
                raise UserError(f"config: [{name}] must be a table of keys, got {given!r}")
            keys = [f.name for f in dataclasses.fields(section)]  # type: ignore[arg-type]
            bad = sorted(set(given) - set(keys))
            if bad:
                raise UserError(f"config: unknown keys {bad} in [{name}]; valid: {keys}")
            sections[name] = section(**given)
        return cls(**sections)

    def with_overrides(self, overrides: Sequence[str]) -> Config:
        """A new config with ``section.key=value`` overrides applied in order."""
        values = self.to_dict()
        for text in overrides:
            section, key, value = parse_override(text)
            if section not in values:
                raise UserError(
                    f"--set {text!r}: unknown section {section!r}; valid: {list(_SECTIONS)}"
                )
            values[section][key] = value
        return Config.from_dict(values)

    def differences(self, other: Config) -> list[str]:
        """``section.key`` names whose values differ between two configs."""
        a, b = self.to_dict(), other.to_dict()
        return [f"{s}.{k}" for s in a for k in a[s] if a[s][k] != b[s][k]]


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"train.steps=100"`` -> ``("train", "steps", 100)``; see the module docstring."""
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise UserError(f"--set {text!r}: expected section.key=value, e.g. --set train.steps=100")
    try:
        value = tomllib.loads(f"value = {raw.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> Config:
    """The defaults, updated by a TOML file (if given) and then by ``--set`` overrides."""
    config = Config()
    if path is not None:
        expected = "a TOML config with [data], [model], [optim], [train] sections"
        with reading(path, expected), open(path, "rb") as f:
            values = tomllib.load(f)
            if not values:
                raise UserError(
                    f"{os.fspath(path)}: holds no [data], [model], [optim] or [train] section "
                    "(leave out --config to use the defaults)"
                )
            config = Config.from_dict(values)
    return config.with_overrides(overrides)
