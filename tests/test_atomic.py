"""The atomic-write helpers every writer uses: publish never overwrites, replace never mixes
or loses the old directory, a full disk says so and leaves nothing behind."""

from __future__ import annotations

import errno
import os

import pytest

from embcore import _atomic


def test_publish_dir_never_overwrites(tmp_path):
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "f").write_text("new")
    (tmp_path / "empty").mkdir()
    _atomic.publish_dir(tmp_path / "new", tmp_path / "empty")  # an empty directory is replaced
    assert (tmp_path / "empty" / "f").read_text() == "new"
    (tmp_path / "other").mkdir()
    for target in ("empty", "file"):
        (tmp_path / "file").write_text("x")
        with pytest.raises(FileExistsError, match="it is never overwritten"):
            _atomic.publish_dir(tmp_path / "other", tmp_path / target)
    assert (tmp_path / "file").read_text() == "x" and (tmp_path / "other").is_dir()


def test_replace_dir_puts_the_old_directory_back_when_publishing_fails(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "marker").write_text("old")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "marker").write_text("new")

    def lost_the_race(tmp, path):
        raise FileExistsError(errno.EEXIST, "another writer published first")

    monkeypatch.setattr(_atomic, "publish_dir", lost_the_race)
    with pytest.raises(FileExistsError, match="another writer"):
        _atomic.replace_dir(tmp_path / "tmp", tmp_path / "out", "marker")
    assert sorted(os.listdir(tmp_path)) == ["out", "tmp"]
    assert (tmp_path / "out" / "marker").read_text() == "old"
    monkeypatch.undo()
    _atomic.replace_dir(tmp_path / "tmp", tmp_path / "out", "marker")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert (tmp_path / "out" / "marker").read_text() == "new"


def test_a_full_disk_is_named_and_leaves_no_temporary_file(tmp_path):
    def full(f):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(
        _atomic.DiskFullError, match=r"no space left on the device while writing .*x\.json"
    ):
        _atomic.write_atomic(tmp_path / "x.json", full)
    assert os.listdir(tmp_path) == []
    _atomic.write_atomic(tmp_path / "x.json", b"{}")
    assert (tmp_path / "x.json").read_bytes() == b"{}" and os.listdir(tmp_path) == ["x.json"]


def test_write_atomic_never_replaces_what_is_not_a_regular_file(tmp_path, capsys):
    """A careless ``--output`` (a link, a directory, a FIFO; ``/dev/null`` as root) is refused:
    renaming over it would replace the link, the device or the FIFO with a file."""
    (tmp_path / "real").write_text("kept")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name, kind in (("link", "a symbolic link"), ("fifo", "a FIFO"), ("dir", "a directory")):
        with pytest.raises(FileExistsError, match=f"exists and is {kind}, not a regular file"):
            _atomic.write_atomic(tmp_path / name, b"x")
    assert os.path.islink(tmp_path / "link") and (tmp_path / "real").read_text() == "kept"
    assert sorted(os.listdir(tmp_path)) == ["dir", "fifo", "link", "real"]
    _atomic.write_atomic(tmp_path / "real", b"new")  # a regular file is replaced
    assert (tmp_path / "real").read_text() == "new"
    from embcore.cli.main import main

    assert main(["plan", "--workload", "W1", "-w", "2", "--output", str(tmp_path / "fifo")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "exists and is a FIFO" in err, err
