"""Training checkpoints: atomic files, exact round trips, no pickles."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from embcore.train.run_state import (
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    optimizer_from_tensors,
    optimizer_to_tensors,
    prune_checkpoints,
    save_checkpoint,
)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    tensors = {"a": torch.randn(3, 4), "b/c": torch.tensor(7.5), "i": torch.arange(5)}
    meta = {"step": 3, "loss_sum": 0.1 + 0.2, "history": {"eval": [{"auc": 1 / 3}]}}
    path = save_checkpoint(checkpoint_path(tmp_path, 3), tensors, meta)
    got, got_meta = load_checkpoint(path)
    assert got.keys() == tensors.keys()
    assert all(torch.equal(got[k], tensors[k]) and got[k].dtype == tensors[k].dtype for k in got)
    assert got_meta["loss_sum"] == 0.1 + 0.2 and got_meta["history"] == meta["history"]
    assert not list(tmp_path.glob("*.tmp"))


def test_latest_ignores_partial_files_and_prune_keeps_the_newest(tmp_path: Path) -> None:
    for step in (5, 10, 15):
        save_checkpoint(checkpoint_path(tmp_path, step), {"x": torch.zeros(1)}, {"step": step})
    (tmp_path / "step_00000020.safetensors.tmp").write_bytes(b"torn")  # a killed write
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 15)
    prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == [
        "step_00000010.safetensors",
        "step_00000015.safetensors",
    ]
    assert latest_checkpoint(tmp_path / "missing") is None


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    save_file({"x": torch.zeros(1)}, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="not an embcore training checkpoint"):
        load_checkpoint(tmp_path / "other.safetensors")


def test_adam_state_round_trip_continues_identically(tmp_path: Path) -> None:
    torch.manual_seed(0)

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
        return model, torch.optim.Adam(model.parameters(), lr=0.01)

    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(i))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    model, opt = make()
    for i in range(3):
        step(model, opt, i)
    tensors, meta = optimizer_to_tensors(opt, "opt")
    tensors.update({f"m/{k}": v for k, v in model.state_dict().items()})
    save_checkpoint(tmp_path / "c.safetensors", tensors, {"optimizer": meta})
    loaded, loaded_meta = load_checkpoint(tmp_path / "c.safetensors")
    model2, opt2 = make()
    model2.load_state_dict({k[2:]: v for k, v in loaded.items() if k.startswith("m/")})
    optimizer_from_tensors(opt2, loaded, loaded_meta["optimizer"], "opt")
    for i in range(3, 6):
        step(model, opt, i)
        step(model2, opt2, i)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
