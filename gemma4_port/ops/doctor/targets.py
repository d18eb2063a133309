"""What doctor runs, planned before anything runs (pure: the machine's cores and RAM are inputs).

Two kinds of target. The tiny layouts: the four ways a Neuron artifact runs (tp 1, batch 4, tp 2 with
the prefill on the device or on the host), on the tiny manifests, in seconds to minutes. The real
shapes: for each model, the variant its default image serves, with random weights of the real config
(the published config.json shapes, vocabulary and all; no token needed), so a compile's time and
RAM, the device memory and the decode speed are the real model's. A target the machine cannot run
(fewer cores than its ranks, less RAM than its compile needs for certain) is skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch
import yaml

from contract.errors import Gemma4Error
from gemma4_port import MANIFESTS
from gemma4_port.ops.capacity import GIB, footprint
from gemma4_port.ops.model_sizes import ModelSizes
from gemma4_port.source.configs import KNOWN_TEXT_CONFIGS, audio_config_for, text_config_for, vision_config_for
from gemma4_port.source.manifest import Manifest, load_manifest, parse_manifest

TINY = {  # layout -> (tiny manifest, variant)
    "tp1": ("tiny-e2b", "bf16"),
    "batch4": ("tiny-e2b", "b4"),
    "tp2-device-prefill": ("tiny-e4b", "tp2-bf16"),
    "tp2-host-prefill": ("tiny-e4b", "tp2-host"),
    "tp2-speculative": ("tiny-e2b", "spec-tp2"),  # verify and draft keys on the decoder's KV state
    "tp2-media": ("tiny-e2b", "media-tp2"),  # the image and audio encoders, a tp 1 model beside the tp 2 one
}
REAL = {"e2b": "gemma-4-e2b", "e4b": "gemma-4-e4b", "12b": "gemma-4-12b"}  # target -> shipped manifest
# Of the tiny layouts, the one whose server answers a request and the one that runs `build.py bench`
# (every real target is served and measured).
SERVED, BENCHED = "tp2-device-prefill", "tp1"


class DoctorError(Gemma4Error, ValueError):
    pass


@dataclass(frozen=True)
class Target:
    name: str
    manifest: Manifest = field(
        repr=False
    )  # for a real target: the random-weights manifest doctor writes next to its report
    variant: str
    real: bool
    serve: bool  # serve the artifact and answer (real targets: and measure TTFT and tok/s)
    bench: bool  # run `build.py bench` on it

    @property
    def tp(self) -> int:
        return self.manifest.variant(self.variant).tp


@dataclass(frozen=True)
class Skip:
    name: str
    reason: str


def all_names() -> list[str]:
    return [*TINY, *REAL]


def select(layouts: str | None) -> list[str]:
    """--layouts as names, refusing an unknown one with the names there are."""
    names = [n.strip() for n in layouts.split(",") if n.strip()] if layouts else all_names()
    unknown = [n for n in names if n not in all_names()]
    if unknown:
        raise DoctorError(f"--layouts {','.join(unknown)}: no such layout (have {', '.join(all_names())})")
    return list(dict.fromkeys(names))


_CONFIG_METADATA = ("transformers_version", "model_type")  # written by transformers, not config fields


def real_manifest(shipped: Manifest) -> Manifest:
    """The shipped manifest's default-image variant, its model random with the published configs (text and
    the towers its media budgets need), without
    its speculative drafter (a hub checkpoint whose shapes are assumed here: the tiny manifests' drafters
    stand for the speculative layouts)."""
    if shipped.model.source not in KNOWN_TEXT_CONFIGS:
        raise DoctorError(f"{shipped.name}: {shipped.model.source} has no published config to stand in for")
    served = (shipped.images and shipped.images.variant) or shipped.variants[0].name
    data = shipped.model_dump(mode="json", exclude_none=True)
    random: dict = {"seed": 0, "config": KNOWN_TEXT_CONFIGS[shipped.model.source]}
    for tower, config in (("vision", vision_config_for(shipped)), ("audio", audio_config_for(shipped))):
        if config is not None:  # the published towers too: the variant's media budgets compile their encoders
            random[tower] = {k: v for k, v in config.to_diff_dict().items() if k not in _CONFIG_METADATA}
    data |= {
        "name": f"doctor-{shipped.name}",
        "model": {"random": random},
        "variants": [v for v in data["variants"] if v["name"] == served],
    }
    data.pop("images", None)
    data.pop("speculative", None)
    return parse_manifest(data, f"doctor's stand-in for {shipped.name}")


def manifest_yaml(manifest: Manifest) -> str:
    return yaml.safe_dump(manifest.model_dump(mode="json", exclude_none=True), sort_keys=False)


def target(name: str) -> Target:
    if name in TINY:
        file, variant = TINY[name]
        return Target(name, load_manifest(MANIFESTS / f"{file}.yaml"), variant, False, name == SERVED, name == BENCHED)
    m = real_manifest(load_manifest(MANIFESTS / f"{REAL[name]}.yaml"))
    return Target(name, m, m.variants[0].name, True, serve=True, bench=False)


def _parameters(manifest: Manifest) -> int:
    """The random checkpoint's parameters: the text model's and its towers'."""
    from transformers import Gemma4AudioModel, Gemma4ForCausalLM, Gemma4VisionModel

    with torch.device("meta"):
        models = [Gemma4ForCausalLM(text_config_for(manifest))]
        vision, audio = vision_config_for(manifest), audio_config_for(manifest)
        models += [Gemma4VisionModel(vision)] if vision is not None else []
        models += [Gemma4AudioModel(audio)] if audio is not None else []
        return sum(p.numel() for m in models for p in m.parameters())


@cache
def _host_bytes_needed(name: str) -> int:
    t = target(name)
    config = text_config_for(t.manifest)
    compile_floor = footprint(ModelSizes(config), t.manifest.variant(t.variant)).compile_floor
    return max(8 * _parameters(t.manifest), compile_floor)


def host_bytes_needed(t: Target) -> int:
    """RAM a real target needs for certain: the random checkpoint's writer holds the float32 model and
    a copy of every tensor (8 B a parameter); the compile holds its counted floor (capacity.py)."""
    return _host_bytes_needed(t.name) if t.real else 0


def plan(names: list[str], cores: int | None, host_bytes: int, need=host_bytes_needed) -> list[Target | Skip]:
    """Each selected name as a Target to run, or a Skip saying why not on this machine. `cores`: the
    NeuronCores this process may use (None: unknown, nothing skipped for it)."""
    out: list[Target | Skip] = []
    for name in names:
        t = target(name)
        if cores is not None and cores < t.tp:
            out.append(Skip(name, f"needs {t.tp} NeuronCores (tp {t.tp}), this process may use {cores}"))
            continue
        needed = need(t)
        if host_bytes and needed > host_bytes:
            out.append(
                Skip(
                    name,
                    f"needs >= {needed / GIB:.0f} GiB of host RAM for the random checkpoint and the compile, "
                    f"this host has {host_bytes / GIB:.0f} GiB (add swap, or run on an inf2.8xlarge)",
                )
            )
            continue
        out.append(t)
    return out


def folder(work: Path, t: Target) -> Path:
    return work / t.name
