"""The collectives' public names (``embcore.sharding.comm.CommError``, ...), defined in
:mod:`embcore._comm`, below the stores and checkpoints that use them (docs/sharding.md)."""

from embcore._comm import (
    STEP_KINDS,
    Comm,
    CommError,
    CommStats,
    Exchange,
    Inbox,
    OutOfStepError,
    Reducer,
)

__all__ = [
    "STEP_KINDS",
    "Comm",
    "CommError",
    "CommStats",
    "Exchange",
    "Inbox",
    "OutOfStepError",
    "Reducer",
]
