"""What an image registry says of a pushed image, over its HTTP API (distribution's /v2/): its layers' sizes."""

from __future__ import annotations

import requests

MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"


def layer_sizes(repository: str, digest: str) -> list[int] | None:
    """The compressed sizes of the image's layers, in the image's order; None where the registry does not say
    (Docker Hub's manifests need a token; the push's layer counts still tell the story)."""
    registry, _, name = repository.partition("/")
    if "." not in registry and ":" not in registry:
        return None
    scheme = "http" if registry.startswith(("127.", "localhost")) else "https"
    try:
        manifest = requests.get(
            f"{scheme}://{registry}/v2/{name}/manifests/{digest}", headers={"Accept": MANIFEST_TYPES}, timeout=30
        )
        manifest.raise_for_status()
    except requests.RequestException:
        return None
    return [blob["size"] for blob in manifest.json()["layers"]]
