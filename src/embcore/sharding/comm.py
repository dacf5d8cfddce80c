"""The collectives' public names (``embcore.sharding.comm.CommError``, ...), defined in
:mod:`embcore._comm`, below the stores and checkpoints that use them (docs/sharding.md)."""

from embcore._comm import Comm, CommError, CommStats, Exchange, Inbox, Reducer

__all__ = ["Comm", "CommError", "CommStats", "Exchange", "Inbox", "Reducer"]
