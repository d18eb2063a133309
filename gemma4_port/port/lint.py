"""Graph lint: refuse a traced graph holding ops that break neuronx-cc, before a two-hour compile.

Each rule is an op that an earlier Gemma port to Inferentia2 hit: data-dependent indexing and scatter, `nonzero`, table
lookups (a vocab-sized table on the device), fused SDPA (overflowed SBUF at sliding window 1024),
a transcendental over a row wider than one 196,608-byte SBUF partition (the vocab-wide softcap
tanh), and control flow (a static graph has none)."""

from __future__ import annotations

from contract.errors import Gemma4Error

SBUF_PARTITION_BYTES = 196_608

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


def _row_bytes(value) -> int | None:
    t = value.type()
    sizes = getattr(t, "sizes", lambda: None)()
    dtype = getattr(t, "scalarType", lambda: None)()
    if not sizes or sizes[-1] is None or dtype not in _ELEMENT_BYTES:
        return None
    return sizes[-1] * _ELEMENT_BYTES[dtype]


def lint_graph(graph, name: str, vocab: int) -> list[str]:
    """Problems in a TorchScript graph, one line each, naming the op and why it is refused."""
    problems = []
    for node in graph.nodes():
        kind = node.kind()
        where = node.sourceRange().split("\n")[0].strip() or "?"
        if kind in FORBIDDEN:
            problems.append(f"{name}: {kind}: {FORBIDDEN[kind]} ({where})")
        elif kind in TRANSCENDENTAL:
            out = node.output()
            row = _row_bytes(out)
            sizes = out.type().sizes() if hasattr(out.type(), "sizes") else None
            if (row and row > SBUF_PARTITION_BYTES) or (sizes and sizes[-1] == vocab):
                problems.append(
                    f"{name}: {kind} over rows of {sizes[-1]} elements ({row} B) exceeds a "
                    f"{SBUF_PARTITION_BYTES} B SBUF partition or spans the vocabulary (apply it on the host) ({where})"
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
