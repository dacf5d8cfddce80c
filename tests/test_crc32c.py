"""CRC-32C against the published check values (RFC 3720, appendix B.4, and the "123456789"
check value of the Castagnoli polynomial), and the eight-bytes-at-a-time row kernel against
the byte-at-a-time one on every length around its word boundary."""

from __future__ import annotations

import numpy as np
import pytest

from embcore._numba.crc32c import crc32c, crc32c_rows

VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


@pytest.mark.parametrize(("data", "want"), VECTORS)
def test_published_check_values(data: bytes, want: int) -> None:
    raw = np.frombuffer(data, np.uint8)
    assert crc32c(raw) == want
    assert int(crc32c_rows(raw.reshape(1, -1))[0]) == want


def test_rows_agree_with_the_bytewise_loop_at_every_length() -> None:
    rng = np.random.default_rng(0)
    for length in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 496, 512]:
        rows = rng.integers(0, 256, (20, length), dtype=np.uint8)
        assert crc32c_rows(rows).tolist() == [crc32c(r) for r in rows], length
