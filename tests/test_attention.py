"""Attention over key blocks (layers.py `attention`): the online softmax equals one softmax over every
key, and a long key bucket's graph passes the SBUF lint that a single wide softmax row fails."""

import pytest
import torch

from gemma4_port.port.layers import KEY_BLOCK, attention
from gemma4_port.port.lint import ROW_BUDGET, LintError, check_traced

B, KVU, G, S, D = 1, 2, 4, 8, 32


def inputs(T: int, dtype: torch.dtype):
    torch.manual_seed(0)
    q = torch.randn(B, KVU, G * S, D, dtype=dtype)
    k, v = torch.randn(B, KVU, T, D, dtype=dtype), torch.randn(B, KVU, T, D, dtype=dtype)
    mask = torch.zeros(B, 1, S, T, dtype=dtype)
    neg = torch.finfo(dtype).min  # the host's mask value: finite
    mask[..., : KEY_BLOCK + 100] = neg  # the first block wholly masked, the second in part
    mask[..., 3 * KEY_BLOCK - 20 :] = neg  # and the tail, as past a query's own position
    return q, k, v, mask


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2**-6)])
def test_blocks_give_the_softmax_over_every_key(dtype, tol):
    q, k, v, mask = inputs(4 * KEY_BLOCK, dtype)
    whole = attention(q, k, v, mask, G, block=4 * KEY_BLOCK)  # one block: the plain softmax
    blocks = attention(q, k, v, mask, G)
    assert blocks.dtype == dtype and blocks.shape == whole.shape == (B, KVU, G * S, D)
    assert torch.isfinite(blocks).all()
    assert (blocks.float() - whole.float()).abs().max() <= tol * whole.float().abs().max()


def test_a_ragged_last_block_is_attended_too():
    q, k, v, mask = inputs(2 * KEY_BLOCK + 96, torch.float32)
    mask[...] = 0
    mask[..., : 2 * KEY_BLOCK] = torch.finfo(torch.float32).min  # only the short last block is visible
    got = attention(q, k, v, mask, G)
    want = attention(q, k[:, :, 2 * KEY_BLOCK :], v[:, :, 2 * KEY_BLOCK :], mask[..., 2 * KEY_BLOCK :], G)
    assert torch.allclose(got, want, atol=1e-5)


def test_a_long_key_bucket_passes_the_lint_where_one_softmax_row_does_not():
    T = 49_152
    q, k, v, mask = inputs(T, torch.float32)
    blocked = torch.jit.trace(lambda q, k, v, m: attention(q, k, v, m, G), (q, k, v, mask), check_trace=False)
    check_traced(blocked, "attention over 49152 keys", 1024)
    whole = torch.jit.trace(lambda q, k, v, m: attention(q, k, v, m, G, block=T), (q, k, v, mask), check_trace=False)
    with pytest.raises(LintError, match=f"over the {ROW_BUDGET} B an op may take"):
        check_traced(whole, "one softmax over 49152 keys", 1024)
