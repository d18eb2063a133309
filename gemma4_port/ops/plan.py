"""`build.py plan MANIFEST [--variant V] [--shards]`: the capacity tables (ops/capacity.py) and the
decode roofline (ops/roofline.py) of a manifest's variants, printed with where each figure comes from."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from contract.layout import NeuronLayout
from gemma4_port.console import console as build_console
from gemma4_port.ops.capacity import (
    BUILD_HOST,
    CORE_GIB,
    DEVICE_MEMORY,
    GIB,
    INSTANCES,
    MODEL_CODE_FLOOR,
    POD_LIMIT_GIB,
    PROCESS_BYTES,
    UNKNOWN,
    Footprint,
    Instance,
    compile_threads,
    footprint,
    gib,
    host_verdict,
    model_sizes,
    swap_gib,
)
from gemma4_port.ops.fitting import fixes, kv_max_limit
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.ops.roofline import ALL_REDUCE_S, ASSUMPTIONS, break_even_all_reduce_s, roofline, rooflines
from gemma4_port.ops.speculative_gain import ASSUMPTIONS as SPECULATION_ASSUMPTIONS
from gemma4_port.ops.speculative_gain import break_even_acceptance, drafter_head, speculation
from gemma4_port.port.sharding import shard_table
from gemma4_port.source.configs import drafter_config_source, text_config_for
from gemma4_port.source.manifest import Manifest, load_manifest

SHORT = {"float32": "fp32", "bfloat16": "bf16"}
POD = Instance(f"xlarge pod ({POD_LIMIT_GIB} Gi)", POD_LIMIT_GIB, INSTANCES[0].vcpus)


def describe(layout: NeuronLayout) -> str:
    keys = layout.keys
    copies, verifies, drafts = (len(keys.get(k, ())) for k in ("copy", "verify", "draft"))
    n = len(layout.device_graphs) - copies - verifies - drafts
    return (
        (f"{n} decode (host prefill)" if layout.host_prefill else f"{n} graphs")
        + (f" + {copies} copy" if copies else "")
        + (f" + {verifies} verify" if verifies else "")
        + (f" + {drafts} draft" if drafts else "")
        + (f" + {len(layout.encoders)} encoder" if layout.encoders else "")
    )


def core_table(manifest: Manifest, sizes: ModelSizes, fps: list[Footprint]) -> Table:
    title = f"{manifest.name}: per NeuronCore ({CORE_GIB} GiB), GiB; counted = tensors + scratchpad + model code floor"
    core = Table(title=title)
    columns = ("variant", "tp", "dtype", "batch x kv_max", "ring", "graphs", "weights", "encoder", "KV", "scratchpad")
    for col in (*columns, "kv_max up to", "counted", "fits"):
        core.add_column(col)
    for fp in fps:
        v = fp.variant
        core.add_row(
            v.name,
            str(v.tp),
            SHORT[v.dtype],
            f"{v.batch} x {v.kv_max}",
            str(sizes.ring(v)),
            describe(fp.layout),
            gib(fp.rank_weights) + (f" (drafter {gib(fp.drafter_weights // v.tp)})" if fp.drafter_weights else ""),
            gib(fp.encoder_weights) if fp.encoder_weights else "-",
            gib(fp.rank_kv),
            f"{gib(fp.scratchpad)} ({fp.largest_graph})",
            kv_max_limit(sizes, fp),
            f"{gib(fp.counted_core)} ({100 * fp.counted_core / (CORE_GIB * GIB):.0f}%)",
            "yes" if fp.fits_core else "[bold red]NO[/]",
        )
    return core


def host_table(manifest: Manifest, fps: list[Footprint]) -> Table:
    host = Table(title=f"{manifest.name}: host RAM, GiB (counted; the rest unknown until measured)")
    instances = (*INSTANCES, POD)
    columns = ("variant", "serve", "first load", "compile floor", "cc jobs at once (xl / 8xl)")
    for col in (*columns, *(i.name for i in instances), f"build swap, {BUILD_HOST.name}"):
        host.add_column(col)
    for fp in fps:
        jobs = len(fp.layout.device_graphs)
        host.add_row(
            fp.variant.name,
            gib(fp.serve),
            gib(fp.load_peak),
            gib(fp.compile_floor),
            " / ".join(str(min(jobs, compile_threads(i))) for i in INSTANCES),
            *(host_verdict(fp, i) for i in instances),
            f">= {swap_gib(fp.compile_floor, BUILD_HOST.host_gib)}"
            if fp.compile_floor > BUILD_HOST.host_gib * GIB
            else "?",
        )
    return host


def roofline_table(manifest: Manifest, sizes: ModelSizes, fps: list[Footprint]) -> Table:
    roof = Table(title=f"{manifest.name}: decode roofline (HBM bandwidth only; a ceiling), per core")
    columns = ("variant", "tp", "batch", "keys", "weights GiB", "KV GiB", "KV tail GiB", "step ms")
    for col in (*columns, "tok/s per stream", "tok/s aggregate", "tail aliased: per stream"):
        roof.add_column(col)
    for fp in fps:
        for r in rooflines(sizes, fp.variant):
            roof.add_row(
                r.variant,
                str(r.tp),
                str(r.batch),
                str(r.keys),
                gib(r.weight_bytes),
                gib(r.kv_bytes),
                gib(r.tail_bytes),
                f"{1e3 * r.step_s():.1f}",
                f"{r.per_stream():.0f}",
                f"{r.aggregate():.0f}",
                f"{r.per_stream(tail=False):.0f}",
            )
    return roof


def tp_comparison(sizes: ModelSizes, fps: list[Footprint]) -> str | None:
    """What the roofline says of tp 2 against tp 1 for the same model, batch 1 at the largest key bucket."""
    one = [fp.variant for fp in fps if fp.variant.tp == 1 and fp.variant.batch == 1]
    two = [fp.variant for fp in fps if fp.variant.tp == 2 and fp.variant.batch == 1 and fp.variant.prefill == "device"]
    if not one or not two:
        return None
    a, b = (roofline(sizes, v, v.kv_max, 1) for v in (one[0], two[0]))
    winner = b if b.step_s() < a.step_s() else a
    return (
        f"tp 2 ({b.variant}) against tp 1 ({a.variant}), batch 1 over {a.keys} keys: {b.per_stream():.0f} against "
        f"{a.per_stream():.0f} tok/s per stream with {b.all_reduces} all-reduces of {ALL_REDUCE_S * 1e6:.0f} us "
        f"(assumed); tp 2 stays faster while an all-reduce takes under "
        f"{break_even_all_reduce_s(a, b) * 1e6:.0f} us. Faster by the roofline: {winner.variant}."
    )


SPECULATION_ACCEPTANCE = (0.5, 0.7)  # the acceptances the predicted gain is printed at


def speculation_lines(manifest: Manifest, sizes: ModelSizes, fps: list[Footprint]) -> list[str]:
    """Each variant with the manifest's drafter: its predicted per-stream gain at batch 1 over its largest
    key bucket (ops/speculative_gain.py), and the acceptance below which the drafter does not pay."""
    lines = []
    for fp in fps:
        v = fp.variant
        if not sizes.speculation(v)[1]:
            continue
        k, keys = manifest.speculative.k, v.key_buckets[-1]
        gains = [speculation(sizes, v, keys, k, a, drafter=True).gain for a in SPECULATION_ACCEPTANCE]
        at = ", ".join(f"{g:.2f}x at acceptance {a}" for g, a in zip(gains, SPECULATION_ACCEPTANCE, strict=True))
        verdict = "; [bold]speculation does not pay[/] at acceptance 0.5" if gains[0] < 1 else ""
        lines.append(
            f"speculative decoding on {v.name} (k = {k}, batch 1 over {keys} keys): {at}; the drafter pays only "
            f"above acceptance {break_even_acceptance(sizes, v, keys, k):.2f}{verdict}"
        )
    if lines:
        source = drafter_config_source(manifest)
        lines.append(f"Drafter: {source}, {drafter_head(sizes)}; {SPECULATION_ASSUMPTIONS}.")
    return lines


def notes(sizes: ModelSizes) -> str:
    m = sizes.shard(1, 0)
    whole, lm_head = sizes.weights(1, 0), m.vocab * m.hidden
    sources = "\n".join(f"  {name}: {source}" for name, source in DEVICE_MEMORY.items())
    return (
        "graphs: one NxD ModelBuilder model per variant, its prefill and decode buckets sharing one copy of each "
        "rank's weights per core; with host prefill the model is decode alone and the prompt is prefilled on the "
        "host CPU; at batch > 1, + a fork's copy per key bucket (no weights); with media budgets, + an encoder model "
        "(tp 1, on rank 0's core) of a graph per image and audio soft-token bucket.\n"
        f"Per core, neuron-monitor's categories and where each figure comes from (runtime memory: ?; model code: "
        f">= {gib(MODEL_CODE_FLOOR)}):\n{sources}\n"
        "tensors: every parameter and buffer of the rank's device graph (Gemma4Decoder of the sharding plan, "
        "built on the meta device) and the KV buffers (kv_max positions for a global layer, a ring of the window "
        "plus the largest bucket for a sliding one). The scratchpad's working set: the largest graph's (named beside "
        "it), one layer's float32 attention scores over kv_max keys and its mask-and-write rows; the queries are "
        "the largest bucket for a prefill, the batch for decode (host prefill) and for a drafter step (the "
        "drafter's query heads), batch x (k + 1) for a verify. kv_max up to: the smallest of what the core's "
        "memory holds beside the weights (HBM) and the model's context (max_position_embeddings); attention "
        "runs over key blocks, so no "
        "SBUF row grows with it (an upper bound, the scores above count every block as alive at once). The whole "
        f"model is {whole / 1e9:.2f}B elements = {gib(4 * whole)} GiB fp32, {gib(2 * whole)} GiB bf16; at tp 2 a "
        f"core holds more than half, as lm_head ({gib(2 * lm_head)} GiB bf16), norms and replicated K/V sit on "
        "both cores. fits: the counted categories within the core; what is left is for the unknown ones.\n"
        f"Host: serve = process ({gib(PROCESS_BYTES)}, an allowance: the Neuron SDK's import is {UNKNOWN}) + word "
        f"and PLE tables ({sizes.host_tables() / 1e9:.2f}B elements) + the rotary rows of every position up to "
        "kv_max + the host prefill (the whole model, once); first load = serve + every rank's weight file on its "
        f"way to the cores (the neffs on top: {UNKNOWN}); compile floor = process + each weighted key's rank "
        "module + the whole checkpoint and a rank's cut while it shards; neuronx-cc's own RAM per graph "
        f"(several at once: a thread pool of min(32, vCPUs + 4)) is {UNKNOWN}, so a compile gets no 'no swap' "
        "verdict, only the swap its floor already needs.\n"
        f"Roofline: {ASSUMPTIONS}"
    )


def render(console: Console, manifest: Manifest, sizes: ModelSizes, fps: list[Footprint]) -> None:
    console.print(core_table(manifest, sizes, fps))
    console.print(host_table(manifest, fps))
    console.print(roofline_table(manifest, sizes, fps))
    for fp in fps:
        if not fp.fits_core:
            options = fixes(sizes, fp) or ["none of bf16, tp 2, host prefill or a smaller kv_max is enough"]
            console.print(f"[bold]{fp.variant.name}[/] does not fit a NeuronCore; fixes: " + "; ".join(options))
    comparison = tp_comparison(sizes, fps)
    if comparison:
        console.print(comparison)
    for line in speculation_lines(manifest, sizes, fps):
        console.print(line)
    console.print(notes(sizes))


def plan_main(args) -> int:
    manifest = load_manifest(args.manifest)
    variants = [manifest.variant(args.variant)] if args.variant else list(manifest.variants)
    config = text_config_for(manifest)
    sizes = model_sizes(manifest)
    console = build_console()
    render(console, manifest, sizes, [footprint(sizes, v) for v in variants])
    if args.shards:
        for tp in sorted({v.tp for v in variants}):
            console.print(shard_table(config, tp))
    return 0
