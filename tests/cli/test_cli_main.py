"""``embcore`` itself: no command is a usage error (exit 2, help on stderr), as argparse's."""

from __future__ import annotations

import pytest

from embcore.cli.main import COMMANDS, main


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "usage: embcore" in captured.err and "give a command" in captured.err
    assert all(name in captured.err for name in COMMANDS)


def test_an_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["trian"])
    assert info.value.code == 2 and "invalid choice: 'trian'" in capsys.readouterr().err
