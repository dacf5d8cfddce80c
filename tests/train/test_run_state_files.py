"""Training-run checkpoints carry a sha256 of every tensor and of their JSON: a flipped bit
anywhere, a truncated file or a file without checksums is refused, naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from embcore._fingerprint import IntegrityError
from embcore.train.run_state import checkpoint_path, load_checkpoint, save_checkpoint


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    tensors = {"model/w": torch.randn(16, 8), "step": torch.tensor(3), "opt/0/m": torch.ones(5)}
    return save_checkpoint(checkpoint_path(tmp_path, 3), tensors, {"step": 3, "lr": 0.5})


def header_size(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


@pytest.mark.parametrize("where", ["first tensor byte", "middle", "last byte"])
def test_a_flipped_bit_in_the_tensors_is_refused(saved, where):
    data = bytearray(saved.read_bytes())
    start = header_size(saved)
    at = {"first tensor byte": start, "middle": (start + len(data)) // 2, "last byte": -1}[where]
    data[at] ^= 0x04
    saved.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=rf"{saved}.* is corrupt: tensor\(s\) \['"):
        load_checkpoint(saved)


def test_a_changed_value_in_the_json_is_refused(saved):
    data = saved.read_bytes()
    assert data.count(b'\\"lr\\": 0.5') == 1
    saved.write_bytes(data.replace(b'\\"lr\\": 0.5', b'\\"lr\\": 9.5'))
    with pytest.raises(IntegrityError, match="its JSON metadata does not match its sha256"):
        load_checkpoint(saved)


def test_a_truncated_file_is_refused(saved):
    saved.write_bytes(saved.read_bytes()[:-7])
    with pytest.raises(IntegrityError, match=rf"{saved}: not a readable safetensors file"):
        load_checkpoint(saved)


def test_a_file_without_checksums_is_refused(tmp_path):
    meta = json.dumps({"format": "embcore-train-checkpoint", "version": 1, "step": 1})
    save_file({"x": torch.zeros(2)}, tmp_path / "c.safetensors", metadata={"embcore": meta})
    with pytest.raises(IntegrityError, match=r"c\.safetensors: no checksums"):
        load_checkpoint(tmp_path / "c.safetensors")
