"""Each pitfall the Neuron compiler trips on, planted in a small traced module, must be refused."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gemma4_port.port.lint import LintError, check_traced

VOCAB = 4096


class Planted(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.table = nn.Parameter(torch.randn(VOCAB, 8))

    def forward(self, x, ids):
        return self.fn(self, x, ids)


CASES = {
    "index": (lambda m, x, ids: x[ids], "aten::index"),
    "index_select": (lambda m, x, ids: torch.index_select(x, 0, ids), "aten::index_select"),
    "scatter": (lambda m, x, ids: torch.zeros(8, 8).scatter(0, ids[:, None].expand(-1, 8), x), "scatter"),
    "nonzero": (lambda m, x, ids: torch.nonzero(x > 0), "nonzero"),
    "embedding": (lambda m, x, ids: F.embedding(ids, m.table), "embedding lookup"),
    "vocab tanh": (lambda m, x, ids: torch.tanh(x @ m.table.T / 30) * 30, "spans the vocabulary"),
    "sdpa": (
        lambda m, x, ids: F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None]),
        "fused SDPA",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_planted_op_is_refused(name):
    fn, words = CASES[name]
    x, ids = torch.randn(8, 8), torch.tensor([1, 3])
    traced = torch.jit.trace(Planted(fn), (x, ids), check_trace=False)
    with pytest.raises(LintError, match=words):
        check_traced(traced, name, VOCAB)


def test_softmax_wider_than_an_sbuf_partition_is_refused():
    traced = torch.jit.trace(lambda x: torch.softmax(x, -1), (torch.randn(2, 60_000),))
    with pytest.raises(LintError, match="196608 B SBUF partition"):
        check_traced(traced, "wide softmax", VOCAB)


def test_control_flow_is_refused():
    @torch.jit.script
    def branchy(x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            return x * 2
        return x

    with pytest.raises(LintError, match="control flow"):
        check_traced(branchy, "branchy", VOCAB)


def test_clean_arithmetic_passes():
    traced = torch.jit.trace(lambda x, w: torch.softmax(x @ w, -1) * 0.5, (torch.randn(4, 8), torch.randn(8, 16)))
    check_traced(traced, "clean", VOCAB)


def test_the_real_graphs_pass(compiled):
    folder = compiled("tiny-e2b", "fp32")
    graphs = torch.jit.load(str(folder / "graphs/graphs.pt"))
    for name in ("prefill_16_64", "prefill_32_64", "decode_64"):
        check_traced(getattr(graphs, name), name, 1024)
