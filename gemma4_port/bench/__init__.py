"""`build.py bench [DIR] [--model-scale tiny|small] [--json OUT]`: speed and memory side by side.

One run (run.py, at the settings.py of its scale, on the artifacts.py it is given or compiles) measures, on this
machine and in this order: our compiled graphs against transformers' `generate` (throughput), the host's work per
decode step at the real vocabulary (host_overhead), what batch 4 can buy over batch 1 on this backend before any
server work (batching), the real servers of a batch-1 and a batch-4 artifact, side by side (side_by_side), under
1..8 concurrent streams (concurrency), long prompts (a reused prefix's time to first token, and the running
streams' gaps while long prompts arrive, chunked or whole: longctx), image prompts on an artifact with an image
budget (a new image's time to first token and its encoder's share, a repeated image's cache hit: media), and the
memory of each way of loading the model (memory). Ratios come from numbers measured side by side; targets.py
turns them into PASS/MISS verdicts, report.py into tables, JSON and a plot. `--speculative` runs
speculative_report.py instead."""
