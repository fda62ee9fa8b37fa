"""matmul_tiled's loop order: the operand that does not fit in cache is the one read once (a traffic model of
the two orders), so Whisper's FFN-down [1500, 1536] x [1536, 384] sweeps each column group over every row
instead of streaming its 2.4 MB of weights once per 6-row block."""

from kiln.schedules.rules.matmul import CACHE_BYTES, _columns_outer


def test_large_weights_are_swept_once():
    assert _columns_outer(1500, 384, 1536, 6, 64)  # FFN-down: weights 2.4 MB
    assert _columns_outer(1500, 768, 384, 6, 64)  # merged Q/V projection: weights 1.2 MB


def test_weights_that_fit_stay_inner():
    assert 4 * 384 * 256 < CACHE_BYTES
    assert not _columns_outer(1500, 256, 384, 6, 64)  # weights of 393 KB stay in cache, the rows stream once


def test_few_rows_many_columns_is_columns_outer():
    assert _columns_outer(40, 8210, 512, 6, 64)  # a classifier over 8210 characters, 40 steps
    assert not _columns_outer(64, 48, 32, 6, 16)  # both tiny: the bigger extent (rows) outside
