"""The benchmark's tables, JSON and plot, all computed from one result dict with its verdicts
(targets.py), so the JSON alone reproduces every number printed."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _f(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def _verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]MISS[/]"


def print_report(result: dict, console: Console | None = None) -> None:
    console = console or Console()
    meta, tp, host = result["meta"], result["throughput"], result["host_overhead"]

    t = Table(
        title=f"Decode: compiled graphs vs transformers generate ({tp['name']}/{tp['variant']}, {tp['dtype']}, "
        f"{tp['new_tokens']} new tokens, {tp['torch_threads']} torch thread(s))"
    )
    for col in ("", "decode tok/s", "TTFT ms", "token p50 ms", "token p99 ms"):
        t.add_column(col, justify="right")
    for side in ("ours", "transformers"):
        s = tp[side]
        t.add_row(
            side, _f(s["decode_tok_s"]), _f(s["ttft_ms"]), _f(s["token_ms"]["p50"], 2), _f(s["token_ms"]["p99"], 2)
        )
    t.add_row("ratio", f"{tp['decode_speedup']:.2f}x", f"{tp['ttft_speedup']:.2f}x", "", "")
    console.print(t)

    g = host["geometry"]
    t = Table(
        title=f"Host work per decode step (vocab {g['vocab']:,}, PLE {g['ple_width']:,}, {g['dtype']}, "
        f"kv_max {g['kv_max']}, {host['torch_threads']} torch thread(s)): us p50, and the step's share "
        f"of a {host['device_step_ms']:g} ms device step"
    )
    for col in (
        "sampler",
        "nucleus",
        "embed+PLE",
        "inputs",
        "logits row",
        "sample",
        "detok",
        "step p50",
        "step p99",
        "share",
    ):
        t.add_column(col, justify="right")
    for name, s in host["samplers"].items():
        p, dist = s["parts_us"], s["distribution"]
        nucleus = f"{dist['nucleus_tokens']:,} ({dist['entropy_nats']:.1f} nats)" if dist else ""
        t.add_row(
            name,
            nucleus,
            *(_f(p[k]["p50"]) for k in ("embed", "inputs", "logits_row", "sample", "detok")),
            _f(s["step_us"]["p50"]),
            _f(s["step_us"]["p99"]),
            f"{100 * s['share_of_device_step_p50']:.2f}%",
        )
    console.print(t)

    con = result["constrained"]
    t = Table(
        title=f"Constrained decoding ({con['grammar_engine']}) and logprobs per decode step (vocab "
        f"{con['vocab']:,}, {con['steps']} steps): us; the mask is part of the step"
    )
    for col in ("case", "mask p50", "mask p99", "step p50", "step p99", "outputs done / parsed"):
        t.add_column(col, justify="right")
    for name, c in con["cases"].items():
        mask = c.get("mask_us")
        t.add_row(
            name,
            _f(mask["p50"]) if mask else "",
            _f(mask["p99"]) if mask else "",
            _f(c["step_us"]["p50"]),
            _f(c["step_us"]["p99"]),
            f"{c['outputs_completed']} / {c['outputs_parsed']}" if mask else "",
        )
    console.print(t)

    conc = result["concurrency"]
    t = Table(
        title=f"Servers, side by side ({conc['max_tokens']} tokens per streamed request, "
        f"{conc['requests_per_stream']} request(s) per stream, {conc['server_passes']} alternating passes)"
    )
    for col in (
        "artifact",
        "streams",
        "tok/s",
        "tok/s per pass",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "chunk p50 ms",
        "chunk p99 ms",
        "done",
        "503",
        "errors",
    ):
        t.add_column(col, justify="right")
    for label, server in conc["servers"].items():
        for row in server["levels"]:
            t.add_row(
                f"{label} (batch {server['batch']})",
                str(row["streams"]),
                _f(row["tok_s"]),
                " ".join(_f(x) for x in row["pass_tok_s"]),
                _f(row["ttft_ms"]["p50"]),
                _f(row["ttft_ms"]["p99"]),
                _f(row["chunk_gap_ms"]["p50"], 2),
                _f(row["chunk_gap_ms"]["p99"], 2),
                str(row["completed"]),
                str(row["rejected_503"]),
                str(row["errors"]),
            )
    console.print(t)

    bat = result["batching"]
    server = conc["b4_over_b1_at_4_streams"]
    t = Table(
        title=f"Batching on this backend, in process (every slot busy, greedy, {bat['new_tokens']}-token "
        f"requests of {bat['prompt_tokens']} prompt tokens): batch 4 / batch 1 {bat['step_ratio']:.2f}x, "
        f"{bat['ratio_with_prefills']:.2f}x with prefills; the server: "
        + (f"{server:.2f}x" if server is not None else "-")
    )
    for col in ("artifact", "decode step p50 ms", "decode step p99 ms", "prefill p50 ms", "step cost vs batch 1"):
        t.add_column(col, justify="right")
    for label in ("b1", "b4"):
        b = bat[label]
        cost = 1.0 if label == "b1" else bat["step_cost_b4_over_b1"]
        t.add_row(
            f"{label} (batch {b['batch']})",
            _f(b["step_ms"]["p50"], 2),
            _f(b["step_ms"]["p99"], 2),
            _f(b["prefill_ms"]["p50"], 2),
            f"{cost:.2f}x",
        )
    console.print(t)

    long = result.get("long_context")
    if long:
        reuse, inter = long["reuse"], long["interleave"]
        t = Table(
            title=f"Long prompts: a second turn sharing {reuse['shared_tokens']} of {reuse['prompt_tokens']} "
            f"prompt tokens; {inter['streams']} streams of {inter['stream_tokens']} tokens while prompts of "
            f"{inter['long_prompt_tokens']} tokens keep arriving (buckets {inter['buckets']}); "
            f"{reuse['rounds']} alternating rounds"
        )
        for col in ("server", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"):
            t.add_column(col, justify="right")
        for label in ("reuse", "no_reuse"):
            ms = reuse[label]["ttft_ms"]
            t.add_row(label.replace("_", " "), _f(ms["p50"], 2), _f(ms["p99"], 2), "", "")
        for label in ("chunked", "whole_prompt"):
            ms = inter[label]["itl_ms"]
            t.add_row(label.replace("_", " "), "", "", _f(ms["p50"], 2), _f(ms["p99"], 2))
        t.add_row(
            "ratio",
            f"{reuse['ttft_no_reuse_over_reuse']:.2f}x",
            "",
            f"{inter['itl_p50_whole_over_chunked']:.2f}x",
            f"{inter['itl_p99_whole_over_chunked']:.2f}x",
        )
        console.print(t)

    images = result.get("images")
    if images:
        new, same = images["new_image"], images["same_image"]
        t = Table(
            title=f"Image prompts ({images['prompt_tokens']} prompt tokens, an image of {images['max_soft_tokens']} "
            f"soft tokens at most): a new image vs the same again (its KV kept); {images['rounds']} rounds"
        )
        for col in ("request", "TTFT p50 ms", "TTFT p99 ms", "encoder p50 ms", "rest p50 ms", "reused positions"):
            t.add_column(col, justify="right")
        t.add_row(
            "new image",
            _f(new["ttft_ms"]["p50"], 2),
            _f(new["ttft_ms"]["p99"], 2),
            _f(new["encoder_ms"]["p50"], 2),
            _f(new["rest_ms"]["p50"], 2),
            "",
        )
        reused = f"{same['reused_positions']['p50']:g} ({same['encoder_runs']} encoder runs)"
        t.add_row("same image", _f(same["ttft_ms"]["p50"], 2), _f(same["ttft_ms"]["p99"], 2), "", "", reused)
        t.add_row("ratio", f"{images['ttft_new_over_same']:.2f}x", "", "", "", "")
        console.print(t)

    mem = result["memory"]
    t = Table(
        title=f"Memory, MB (host tables {_f(mem['host_tables_mb'])}, graph files {_f(mem['graph_files_mb'])}, "
        f"checkpoint {_f(mem['checkpoint_mb'])})"
    )
    for col in ("process", "RSS after load", "peak RSS", "transformers model module"):
        t.add_column(col, justify="right")
    t.add_row(
        "slim server worker (gunicorn)",
        _f(mem["server_rss_mb"]),
        _f(mem["server_peak_rss_mb"]),
        "imported" if mem["server_model_module_imported"] else "never imported",
    )
    p = mem["transformers_loader"]
    t.add_row(
        "transformers from_pretrained + forward",
        _f(p["rss_mb"]),
        _f(p["peak_rss_mb"]),
        "imported" if p["model_module_imported"] else "never imported",
    )
    console.print(t)

    t = Table(
        title=f"Targets ({meta['scale']}; load average {meta['load_average_start'][0]:.1f} -> "
        f"{meta['load_average_end'][0]:.1f} on {meta['cpus']} CPUs)"
    )
    for col in ("target", "measured", "goal", ""):
        t.add_column(col)
    for tg in result["targets"]:
        value = tg["value"] if isinstance(tg["value"], bool) else _f(tg["value"], 2)
        t.add_row(tg["name"], str(value), tg["goal"], _verdict(tg["passed"]))
    console.print(t)


def write_plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, server in result["concurrency"]["servers"].items():
        rows = server["levels"]
        left.plot(
            [r["streams"] for r in rows],
            [r["tok_s"] for r in rows],
            marker="o",
            label=f"{label} (batch {server['batch']})",
        )
    left.set_xscale("log", base=2)
    left.set_xticks([r["streams"] for r in rows], [str(r["streams"]) for r in rows])
    left.set_ylim(bottom=0)
    left.set(xlabel="concurrent streams", ylabel="aggregate tok/s", title="Server throughput")
    left.legend()
    samples = {k: v for k, v in result["samples"]["token_ms"].items() if v}
    every = [x for v in samples.values() for x in v if x > 0]
    if every:
        bins = np.geomspace(min(every), max(every) * 1.01, 40)
        for name, values in samples.items():
            right.hist(
                values,
                bins=bins,
                weights=np.full(len(values), 1 / len(values)),
                histtype="step",
                linewidth=1.5,
                label=name,
            )
        right.set_xscale("log")
    right.set(xlabel="per-token latency (ms)", ylabel="fraction of tokens", title="Per-token latency")
    right.legend()
    fig.suptitle(f"gemma4-inf2 bench, {result['meta']['scale']} ({result['throughput']['name']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, json_path: Path) -> Path:
    """JSON at `json_path`, the PNG beside it; returns the PNG path."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    png = json_path.with_suffix(".png")
    result["plot"] = png.name
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    write_plot(result, png)
    return png
