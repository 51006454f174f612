"""64-bit index arithmetic: inputs with more than 2**31 elements.

The kernels address every tensor as ``data + batch offsets + head * head_stride + row *
row_stride + column * col_stride`` in int64 (csrc/api/*_params.h, ``batch_offset`` and the
row pointers of csrc/kernels). A bool mask is one byte per element, and ``np.zeros`` maps
its pages lazily, so a ``(46341, 46341)`` mask -- 2**31 + 4633 elements, 2 GiB of address
space -- costs only the pages the kernels touch. With ``window=(0, 0)`` row ``i`` sees key
``i`` alone, so it reads its mask at offset ``i * 46341 + i``, past 2**31 for the last rows:
a 32-bit offset would wrap there and read another row's (or unmapped) bytes. Only the first
and the last rows may attend (``valid_lens`` 0 elsewhere, so those rows never read their
mask), which keeps the touched pages (transparent huge pages included) few.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn

N = 46341  # N * N > 2**31


ROWS = np.r_[0:64, N - 64 : N]  # the rows that may attend


@pytest.fixture(scope="module")
def huge_mask():
    assert N * N > 2**31 and (N - 1) * (N + 1) > 2**31
    mask = np.zeros((N, N), dtype=bool)  # lazily zeroed pages
    mask[ROWS, ROWS] = ROWS % 3 != 0  # the diagonal: attended unless i % 3 == 0
    return mask


def row_lens():
    lens = np.zeros(N, np.int64)
    lens[ROWS] = N
    return lens


def small_inputs(dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((N, 1)).astype(dtype)
    k = rng.standard_normal((N, 1)).astype(dtype)
    v = rng.standard_normal((N, 2)).astype(dtype)
    return q, k, v


def expected_rows(v):
    i = np.arange(N)
    attends = np.isin(i, ROWS) & (i % 3 != 0)
    return np.where(attends[:, None], v, 0).astype(v.dtype)


def test_mask_with_more_than_2_to_the_31_elements_sdpa(huge_mask):
    q, k, v = small_inputs()
    got = fastattn.scaled_dot_product_attention(
        q, k, v, huge_mask, window=(0, 0), valid_lens=row_lens()
    )
    np.testing.assert_array_equal(got, expected_rows(v))  # one key: weight exactly 1


def test_mask_with_more_than_2_to_the_31_elements_family(huge_mask):
    q, k, v = small_inputs()
    expected = expected_rows(v)
    got = fastattn.attention(
        q, k, v, huge_mask, score="dot", normalize="hardmax", window=(0, 0), valid_lens=row_lens()
    )
    np.testing.assert_array_equal(got, expected)
    w = np.ones((1, 4), np.float32)
    got = fastattn.additive_attention(
        q, k, v, w, w, np.ones(4, np.float32), huge_mask, window=(0, 0), valid_lens=row_lens()
    )
    np.testing.assert_array_equal(got, expected)


def test_broadcast_key_with_more_than_2_to_the_31_elements():
    """A stride-0 key/value of 2**31 + 2**26 elements (one row repeated): a decode-shaped
    call over 2**25 + 2**20 keys, split across threads and merged."""
    lk, e = 2**25 + 2**20, 64
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, e))
    k = np.broadcast_to(rng.standard_normal((1, e)), (lk, e))
    v = np.broadcast_to(np.arange(e, dtype=np.float64), (lk, e))
    assert k.size > 2**31
    got = fastattn.scaled_dot_product_attention(q, k, v)
    # Every key alike: uniform weights, the output is the (repeated) value row. float64:
    # the sums over lk terms are good to lk * eps = 4e-9 (float32's lk * eps would be 4).
    np.testing.assert_allclose(got[0], v[0], rtol=1e-7)


_HUGE = 2**33, 2**32  # leading dims whose broadcast product is 2**65: no array holds it


@pytest.mark.parametrize(
    "call",
    [
        lambda q, k: fastattn.scaled_dot_product_attention(q, k, k),
        lambda q, k: fastattn.attention(q, k, k, score="dot"),
        lambda q, k: fastattn.additive_attention(
            q, k, k, np.ones((4, 3)), np.ones((4, 3)), np.ones(3)
        ),
        lambda q, k: fastattn.nadaraya_watson(q[..., 0, :, :1], k[..., 0, :, :1], k[..., 0, :, :2]),
    ],
    ids=["sdpa", "attention", "additive", "nadaraya_watson"],
)
def test_broadcast_result_past_the_array_limit_is_named(call):
    # The leading dims broadcast: the result's shape is what is too large, and the error
    # says so (NumPy's np.broadcast_shapes raised a bare "iterator is too large", which
    # came out as "do not broadcast together").
    q = np.broadcast_to(np.float32(1.5), (_HUGE[0], 1, 1, 3, 4))
    k = np.broadcast_to(np.float32(0.5), (1, _HUGE[1], 1, 3, 4))
    with pytest.raises(ValueError, match=r"the result would have shape \(8589934592, 4294967296"):
        call(q, k)


def test_broadcast_shape_matches_numpy():
    from fastattn._validation import broadcast_shape

    rng = np.random.default_rng(0)
    for _ in range(300):
        a = tuple(rng.choice([0, 1, 2, 3], size=rng.integers(0, 4)))
        b = tuple(rng.choice([0, 1, 2, 3], size=rng.integers(0, 4)))
        try:
            expected = np.broadcast_shapes(a, b)
        except ValueError:
            expected = None
        assert broadcast_shape(a, b) == expected, (a, b)
    assert broadcast_shape((2**40, 1), (1, 2**40)) == (2**40, 2**40)
