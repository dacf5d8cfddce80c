"""User errors: a mistake in what the user gave (a file, a config value, a flag), not a bug.

Code that reads a file the user named does it inside :func:`reading`, which turns every way the
file can be wrong (missing, a directory, unreadable, empty, truncated, binary, not valid JSON,
TOML, gzip, Parquet or safetensors, values out of range) into one :class:`UserError` that names
the file. The command line prints a ``UserError`` as one line and exits with status 2; any
other exception is a bug in embcore and keeps its traceback (docs/main_job.md, "Errors").
"""

from __future__ import annotations

import errno
import json
import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["UserError", "reading"]


class UserError(ValueError):
    """A mistake in the user's input, with a message that says what and where.

    A ``ValueError``, so code that already catches ``ValueError`` for bad input keeps working.
    """


def _describe(error: BaseException) -> str:
    """What went wrong with a file, in words (no exception class names)."""
    if isinstance(error, OSError) and error.errno is None:
        pass  # raised by embcore or a library with its own message: keep it
    elif isinstance(error, IsADirectoryError):
        return "is a directory"
    elif isinstance(error, NotADirectoryError):
        return "a part of the path is not a directory"
    elif isinstance(error, FileNotFoundError):
        return "no such file"
    elif isinstance(error, PermissionError):
        return "permission denied"
    elif isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return "no space left on the device"
    elif isinstance(error, OSError) and error.strerror:
        return error.strerror[0].lower() + error.strerror[1:]
    if isinstance(error, json.JSONDecodeError):
        if not error.doc.strip():
            return "is empty, expected JSON"
        return f"line {error.lineno}, column {error.colno}: not valid JSON ({error.msg})"
    if isinstance(error, tomllib.TOMLDecodeError):
        return f"not valid TOML: {error}"
    if isinstance(error, UnicodeDecodeError):
        return f"not a text file (byte {error.start} is not UTF-8); is it binary?"
    if isinstance(error, EOFError):
        return "is truncated (the compressed stream ends early)"
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300] if len(text) > 300 else text


@contextmanager
def reading(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Turn any failure to read or understand ``path`` inside the block into a UserError.

    Args:
        path: the file being read; every message starts with it.
        what: what the file should be (``"a Parquet file"``), added to messages about the
            file's form.

    A ``UserError`` raised inside the block that already names the file passes unchanged;
    other ``UserError``, ``ValueError``, ``OSError``, ``EOFError`` and library errors of
    file readers (safetensors, pyarrow, gzip) get the file's name in front.
    """
    name = os.fspath(path)
    try:
        yield
    except (KeyboardInterrupt, MemoryError, RecursionError):
        raise
    except UserError as error:
        if name in str(error):
            raise
        raise UserError(f"{name}: {error}") from None
    except (OSError, ValueError, EOFError, KeyError, TypeError, IndexError) as error:
        raise UserError(_message(name, what, error)) from None
    except Exception as error:
        # Readers' own error types (safetensors' SafetensorError, pyarrow's ArrowException,
        # zlib.error) do not derive from the built-in ones; only they are caught here.
        module = type(error).__module__ or ""
        if not module.startswith(("safetensors", "pyarrow", "zlib", "gzip")):
            raise
        raise UserError(_message(name, what, error)) from None


def _message(name: str, what: str, error: BaseException) -> str:
    text = _describe(error)
    if isinstance(error, (KeyError, TypeError, IndexError)):
        text = f"unexpected content ({type(error).__name__}: {text})"
    if isinstance(error, OSError) and error.filename and os.fspath(error.filename) != name:
        name = os.fspath(error.filename)  # another file than the one being read: name it
    if name in text:
        return text
    hint = f"; expected {what}" if what and not isinstance(error, FileNotFoundError) else ""
    return f"{name}: {text}{hint}"
