"""gemma4_port/reference.py against the transformers it runs on: the cache argument of the installed
version (no deprecated name), incremental decoding equal to a full recompute, and the pinned range."""

from __future__ import annotations

import tomllib
import warnings
from importlib.metadata import version

import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from gemma4_port.source.checkpoint import resolve_checkpoint
from gemma4_port.source.manifest import load_manifest
from gemma4_port.verify.reference import load_reference, reference_greedy
from support import MANIFESTS, ROOT


def test_greedy_uses_the_cache_without_deprecated_arguments():
    model = load_reference(resolve_checkpoint(load_manifest(MANIFESTS / "tiny-e2b.yaml")))
    ids = [2, 100, 200, 300]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers 5.24 warns on `past_key_values` (gone in 5.40)
        tokens, _ = reference_greedy(model, ids, 5)
    with torch.no_grad():  # the same tokens recomputed from scratch: the cache was really used and right
        for i in range(5):
            full = model(input_ids=torch.tensor([ids + tokens[:i]]), use_cache=False).logits[0, -1]
            assert int(full.argmax()) == tokens[i]


def test_transformers_is_bounded_to_a_range_that_holds_the_installed_version():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [Requirement(d).specifier for d in deps if Requirement(d).name == "transformers"]
    assert any(s.operator == "<" for s in spec), "transformers has no upper bound"
    assert version("transformers") in SpecifierSet(str(spec))
