"""Memory: what an artifact holds on disk for the host (tables) and for the graphs, and the RSS of a
fresh process that loads the full checkpoint with transformers (the alternative to the slim server,
whose RSS server.py reads). The load runs in a child process of its own; the child reports its RSS
after loading and one forward pass (transformers memory-maps safetensors: its weights count only once
touched), its peak RSS, and that transformers' model module was imported (the same probe finds
none in the server). The peak is the child's VmHWM: its ru_maxrss would include the RSS of the
benchmark process it was forked from (Linux carries the pre-exec high-water mark across exec)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from contract.artifact import HOST_TABLES, ArtifactMeta
from gemma4_port import child_env
from gemma4_port.bench.bench_error import BenchError
from gemma4_port.bench.server import MODEL_MODULE

MB = 1 << 20

# The model stays referenced (`m`) while the RSS is read.
_CHILD = """
import json, os, sys
from pathlib import Path
import psutil, torch
from gemma4_port.bench.server import vm_hwm
from gemma4_port.verify.reference import load_reference
torch.set_grad_enabled(False)
m = load_reference(Path({ckpt!r})).to(getattr(torch, {dtype!r}))
m(torch.tensor([[2, 3, 4]]))
print(json.dumps({{"rss": psutil.Process().memory_info().rss, "peak_rss": vm_hwm(os.getpid()),
                  "model_module_imported": {module!r} in sys.modules}}))
"""


def artifact_bytes(folder: Path, meta: ArtifactMeta) -> dict[str, int]:
    return {
        "host_tables": (folder / HOST_TABLES).stat().st_size,
        "graph_files": sum((folder / rel).stat().st_size for rel in set(meta.graphs.values())),
    }


def checkpoint_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))


def transformers_process(ckpt: Path, dtype: str) -> dict:
    """A process that loads the full checkpoint as a transformers model, at the artifact's dtype."""
    code = _CHILD.format(ckpt=str(ckpt), dtype=dtype, module=MODEL_MODULE)
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"the transformers memory probe failed: {done.stderr.strip().splitlines()[-1:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "rss_mb": out["rss"] / MB,
        "peak_rss_mb": out["peak_rss"] / MB,
        "model_module_imported": out["model_module_imported"],
    }


def measure(folder: Path, meta: ArtifactMeta) -> dict:
    sizes = artifact_bytes(folder, meta)
    ckpt = Path(meta.checkpoint)
    return {
        "host_tables_mb": sizes["host_tables"] / MB,
        "graph_files_mb": sizes["graph_files"] / MB,
        "checkpoint_mb": checkpoint_bytes(ckpt) / MB,
        "transformers_loader": transformers_process(ckpt, meta.geometry.dtype),
    }
