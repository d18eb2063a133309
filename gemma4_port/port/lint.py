"""Graph lint: refuse a traced graph holding ops that break neuronx-cc, before a two-hour compile.

Each rule is an op that an earlier Gemma port to Inferentia2 hit: data-dependent indexing and
scatter, `nonzero`, table lookups (a vocab-sized table on the device), fused SDPA (overflowed SBUF at
sliding window 1024), a transcendental whose rows do not fit an SBUF partition with room to spare
(the vocab-wide softcap tanh did not), and control flow (a static graph has none).

The SBUF rule is the project's, not the compiler's: an op's working set in one partition is its
input row and its output row (a softmax keeps only a max and a sum beside them), and it may take at
most ROW_BUDGET, half of a partition, so the compiler keeps room for the tiles it schedules beside
(weights, the other operand of the next matmul). Attention stays far below it: its rows are key
blocks (layers.py `attention`), whatever the key bucket.
"""

from __future__ import annotations

from contract.errors import Gemma4Error

# 24 MiB of SBUF in 128 partitions per NeuronCore-v2: 192 KiB each (aws-neuron-sdk v2.28.0
# nki/guides/architecture/trainium_inferentia2_arch.rst:76-79).
SBUF_PARTITION_BYTES = 196_608
ROW_BUDGET = SBUF_PARTITION_BYTES // 2  # an op's input and output rows; the other half is headroom

FORBIDDEN = {
    "aten::index": "data-dependent indexing",
    "aten::index_put": "data-dependent indexing",
    "aten::index_put_": "data-dependent indexing",
    "aten::index_select": "data-dependent indexing",
    "aten::gather": "data-dependent indexing",
    "aten::take": "data-dependent indexing",
    "aten::scatter": "scatter",
    "aten::scatter_": "scatter",
    "aten::scatter_add": "scatter",
    "aten::scatter_add_": "scatter",
    "aten::masked_scatter": "scatter",
    "aten::nonzero": "nonzero (data-dependent shape)",
    "aten::embedding": "embedding lookup (tables stay on the host)",
    "aten::embedding_bag": "embedding lookup (tables stay on the host)",
    "aten::scaled_dot_product_attention": "fused SDPA (use explicit matmul attention)",
    "aten::_scaled_dot_product_attention_math": "fused SDPA (use explicit matmul attention)",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "fused SDPA (use explicit matmul attention)",
    "prim::If": "control flow",
    "prim::Loop": "control flow",
}
TRANSCENDENTAL = {
    "aten::tanh",
    "aten::exp",
    "aten::softmax",
    "aten::_softmax",
    "aten::log_softmax",
    "aten::sigmoid",
    "aten::erf",
}
_ELEMENT_BYTES = {"Float": 4, "Double": 8, "BFloat16": 2, "Half": 2}


class LintError(Gemma4Error, RuntimeError):
    pass


def _row(value) -> tuple[int, int] | None:
    """(elements, bytes) of a tensor value's last dimension, when the trace knows its shape and dtype."""
    t = value.type()
    sizes = getattr(t, "sizes", lambda: None)()
    dtype = getattr(t, "scalarType", lambda: None)()
    if not sizes or sizes[-1] is None or dtype not in _ELEMENT_BYTES:
        return None
    return sizes[-1], sizes[-1] * _ELEMENT_BYTES[dtype]


def working_set(node) -> tuple[int, int] | None:
    """(row elements, bytes in one partition) of a row-wise op: its input row and its output row."""
    out = _row(node.output())
    if out is None:
        return None
    inp = _row(next(iter(node.inputs())))
    return out[0], out[1] + (inp[1] if inp else out[1])


def lint_graph(graph, name: str, vocab: int) -> list[str]:
    """Problems in a TorchScript graph, one line each, naming the op and why it is refused."""
    problems = []
    for node in graph.nodes():
        kind = node.kind()
        where = node.sourceRange().split("\n")[0].strip() or "?"
        if kind in FORBIDDEN:
            problems.append(f"{name}: {kind}: {FORBIDDEN[kind]} ({where})")
        elif kind in TRANSCENDENTAL:
            rows = working_set(node)
            if rows and rows[0] == vocab:
                problems.append(
                    f"{name}: {kind} over rows of {vocab} elements spans the vocabulary "
                    f"(apply it on the host) ({where})"
                )
            elif rows and rows[1] > ROW_BUDGET:
                problems.append(
                    f"{name}: {kind} over rows of {rows[0]} elements: its input and output rows take {rows[1]} B "
                    f"of one partition, over the {ROW_BUDGET} B an op may take (half of a {SBUF_PARTITION_BYTES} B "
                    f"SBUF partition) ({where})"
                )
        for block in node.blocks():
            problems += lint_graph(block, name, vocab)
    return problems


def check_traced(module, name: str, vocab: int) -> None:
    problems = lint_graph(module.inlined_graph, name, vocab)
    if problems:
        raise LintError(
            "graph lint failed (the Neuron compiler would reject or mis-compile this):\n  " + "\n  ".join(problems)
        )
