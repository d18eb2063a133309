"""Memory: what an artifact holds on disk for the host (tables) and for the graphs, and the RSS of a
fresh process loading it the server's way (runtime.loader) next to one loading the full checkpoint
with transformers. Each load runs in a child process of its own, so neither sees the other's pages;
the child reports its RSS after loading and one forward pass (transformers memory-maps safetensors:
its weights count only once touched), its peak (ru_maxrss) and whether transformers' model base
module was imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runtime.artifact import HOST_TABLES, ArtifactMeta

from .errors import BenchError
from .server import MODEL_MODULE, ROOT

MB = 1 << 20

_CHILD = """
import json, resource, sys
import psutil, torch
torch.set_grad_enabled(False)
{load}
print(json.dumps({{"rss": psutil.Process().memory_info().rss,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "model_module_imported": {module!r} in sys.modules}}))
"""
# Each loaded model stays referenced (`m`) while the RSS is read.
_SLIM = "from runtime.loader import load_artifact\nm = load_artifact({folder!r})\nm.runner.greedy([2, 3, 4], 2)"
_TRANSFORMERS = ("from pathlib import Path\nfrom gemma4_port.reference import load_reference\n"
                 "m = load_reference(Path({ckpt!r})).to(getattr(torch, {dtype!r}))\nm(torch.tensor([[2, 3, 4]]))")


def artifact_bytes(folder: Path, meta: ArtifactMeta) -> dict[str, int]:
    return {"host_tables": (folder / HOST_TABLES).stat().st_size,
            "graph_files": sum((folder / rel).stat().st_size for rel in meta.graphs.values())}


def checkpoint_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))


def _child(load: str) -> dict:
    code = _CHILD.format(load=load, module=MODEL_MODULE)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"memory probe failed: {done.stderr.strip().splitlines()[-1:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {"rss_mb": out["rss"] / MB, "peak_rss_mb": out["peak_rss"] / MB,
            "model_module_imported": out["model_module_imported"]}


def slim_process(folder: Path) -> dict:
    """A process that loads the artifact exactly as the server does."""
    return _child(_SLIM.format(folder=str(folder)))


def transformers_process(ckpt: Path, dtype: str) -> dict:
    """A process that loads the full checkpoint as a transformers model, at the artifact's dtype."""
    return _child(_TRANSFORMERS.format(ckpt=str(ckpt), dtype=dtype))


def measure(folder: Path, meta: ArtifactMeta) -> dict:
    sizes = artifact_bytes(folder, meta)
    ckpt = Path(meta.checkpoint)
    return {
        "host_tables_mb": sizes["host_tables"] / MB, "graph_files_mb": sizes["graph_files"] / MB,
        "checkpoint_mb": checkpoint_bytes(ckpt) / MB,
        "slim_loader": slim_process(folder),
        "transformers_loader": transformers_process(ckpt, meta.geometry.dtype),
    }
