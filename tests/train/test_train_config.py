"""The job config: defaults, TOML files, --set overrides and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from embcore.errors import UserError
from embcore.train.config import Config, load_config, parse_override
from embcore.train.resources import check_resources


def test_defaults_round_trip_through_dicts() -> None:
    cfg = Config()
    assert cfg.data.source == "synthetic" and cfg.train.out_dir == "runs/dlrm"
    assert Config.from_dict(cfg.to_dict()) == cfg


def test_toml_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        '[data]\nbatch_size = 512\n[model]\ninteraction = "dcn"\ntop_mlp = [32, 16]\n'
        "[train]\nsteps = 40\n"
    )
    cfg = load_config(path, ["train.steps=7", "optim.dense_lr=1", "data.path=day_0.tsv.gz"])
    assert cfg.data.batch_size == 512 and cfg.model.interaction == "dcn"
    assert cfg.model.top_mlp == (32, 16)
    assert cfg.train.steps == 7
    assert cfg.optim.dense_lr == 1.0 and isinstance(cfg.optim.dense_lr, float)
    assert cfg.data.path == "day_0.tsv.gz"  # not TOML: taken as a string
    assert cfg.model.embedding_dim == 16  # untouched keys keep their defaults


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("train.steps=100", ("train", "steps", 100)),
        ("train.progress=false", ("train", "progress", False)),
        ("model.bottom_mlp=[8, 4]", ("model", "bottom_mlp", [8, 4])),
        ('data.path="a b.tsv"', ("data", "path", "a b.tsv")),
        ("data.path=/x/y.parquet", ("data", "path", "/x/y.parquet")),
    ],
)
def test_parse_override(text: str, want: tuple) -> None:
    assert parse_override(text) == want


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("steps=3", r"expected section\.key=value"),
        ("train.step=3", r"unknown keys \['step'\] in \[train\]; valid: \['steps'"),
        ("trian.steps=3", r"unknown section 'trian'"),
        ("train.steps=1.5", r"\[train\] steps must be an integer, got 1\.5"),
        ("train.steps=0", r"\[train\] steps must be an int >= 1, got 0"),
        ("model.interaction=cross", r"\[model\] interaction must be one of \['dot', 'dcn'\]"),
        ("train.progress=1", r"\[train\] progress must be true or false, got 1"),
        ("data.source=parquet", r"\[data\] path must be a file path for source='parquet'"),
    ],
)
def test_bad_values_name_the_key_and_value(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def test_unknown_section_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[optimizer]\nlr = 1\n")
    with pytest.raises(ValueError, match=r"unknown sections \['optimizer'\]"):
        load_config(path)
    path.write_text("[train\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(path)


def test_differences_lists_changed_keys() -> None:
    a = Config()
    b = a.with_overrides(["train.steps=5", "model.embedding_dim=8"])
    assert a.differences(b) == ["model.embedding_dim", "train.steps"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.embedding_lr=inf", r"\[optim\] embedding_lr must be a finite number, got inf"),
        ("optim.dense_lr=nan", r"\[optim\] dense_lr must be a finite number, got nan"),
        ("optim.embedding_lr=-0.5", r"\[optim\] embedding_lr must be a number > 0, got -0\.5"),
        ("data.zipf_a=-inf", r"\[data\] zipf_a must be a finite number"),
        ("data.bad_rows=ignore", r"\[data\] bad_rows must be one of \['raise', 'skip'\]"),
        (
            "model.initial_capacity=-1",
            r"\[model\] initial_capacity must be an int >= 0 \(0: none\), got -1",
        ),
        (
            "model.initial_capacity=1000",
            r"\[model\] initial_capacity = 1000 reserves keys of dynamic tables, but tables = "
            r'"fixed"; set tables = "dynamic" or leave initial_capacity at 0',
        ),
    ],
)
def test_values_that_pass_type_checks_but_cannot_work(override: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.batch_size=4000000000", r"\[data\] batch_size"),
        ("model.embedding_dim=100000", r"\[model\] embedding_dim"),
        ("data.eval_rows=9000000000", r"\[data\] eval_rows"),
        ("model.top_mlp=[100000000]", "top_mlp"),
    ],
)
def test_sizes_this_machine_cannot_hold_are_refused_up_front(override: str, key: str) -> None:
    config = load_config(None, [override])
    with pytest.raises(UserError, match=rf"{key}.*more than this machine's 8\.0 GiB"):
        check_resources(config, memory=8 << 30)
    check_resources(Config(), memory=8 << 30)  # the defaults fit in 8 GiB


def test_initial_capacity_is_an_int_for_dynamic_tables_that_fits_this_machine() -> None:
    with pytest.raises(UserError, match=r"\[model\] initial_capacity must be an integer, got 1\.5"):
        load_config(None, ['model.tables="dynamic"', "model.initial_capacity=1.5"])
    config = load_config(None, ['model.tables="dynamic"', "model.initial_capacity=100000"])
    assert config.model.initial_capacity == 100_000
    assert Config().model.initial_capacity == 0  # none by default
    check_resources(config, memory=8 << 30)
    huge = config.with_overrides(["model.initial_capacity=10000000000"])
    with pytest.raises(UserError, match=r"\[model\] initial_capacity.*more than this machine"):
        check_resources(huge, memory=8 << 30)
    with pytest.raises(UserError, match=r"\[model\] initial_capacity"):  # its keys alone
        check_resources(huge.with_overrides(['model.storage="disk"']), memory=8 << 30)


def test_an_empty_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("# nothing yet\n")
    with pytest.raises(UserError, match=rf"{path}: holds no \[data\], \[model\]"):
        load_config(path)
    path.write_text("[train]\nsteps = inf\n")
    with pytest.raises(UserError, match=rf"{path}: \[train\] steps must be an integer, got inf"):
        load_config(path)
