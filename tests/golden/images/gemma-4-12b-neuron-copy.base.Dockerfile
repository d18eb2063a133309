# gemma4-inf2 base, neuron flavour (Inferentia2): gemma4-inf2/gemma-4-12b:latest
# Build on an inf2.8xlarge (or any large x86 host: the compile runs on the CPU, not on the device, and
# with no Neuron device visible it pins the platform to Inferentia2 itself, gemma4_port/compile/platform.py).
# Host memory for the compile of each variant:
#   tp2-48k: the compile needs >= 221 GiB of swap on an inf2.8xlarge (128 GiB RAM; build.py plan)
# The image is large (toolchain + artifacts): build and push it once; slim images push only their layer.

FROM ubuntu:22.04 AS toolchain
ARG DEBIAN_FRONTEND=noninteractive
# The manifest's pins, as build arguments: its values reach the shell as variables, never as shell text.
ARG TORCH="2.8.*" \
    NEURONX_CC="2.23.6484.0" \
    TORCH_NEURONX="2.8.0.2.12.22436" \
    NEURONX_DISTRIBUTED="0.17.26814" \
    TRANSFORMERS="5.24.0" \
    NEURON_RUNTIME="2.30.51.0" \
    NEURON_COLLECTIVES="2.30.59.0" \
    NEURON_TOOLS="2.28.23.0"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The Neuron repository's key, fetched by the builder: apt reads an armored key from a .asc file, so
# neither curl nor gnupg goes into the image. Apt packages are pinned: the OS's to the series
# Ubuntu 22.04 ships, the Neuron runtime exactly to the manifest's SDK release.
ADD https://apt.repos.neuron.amazonaws.com/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB /etc/apt/keyrings/neuron.asc
RUN chmod 0644 /etc/apt/keyrings/neuron.asc \
 && apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates=2024* python3.11=3.11.* python3.11-venv=3.11.* \
 && . /etc/os-release \
 && echo "deb [signed-by=/etc/apt/keyrings/neuron.asc] https://apt.repos.neuron.amazonaws.com $VERSION_CODENAME main" \
    > /etc/apt/sources.list.d/neuron.list \
 && apt-get update \
 && apt-get install -y --no-install-recommends aws-neuronx-runtime-lib="${NEURON_RUNTIME}-*" aws-neuronx-collectives="${NEURON_COLLECTIVES}-*" aws-neuronx-tools="${NEURON_TOOLS}-*" \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/venv/bin:/opt/aws/neuron/bin:$PATH \
    LD_LIBRARY_PATH=/opt/aws/neuron/lib \
    PYTHONUNBUFFERED=1
# CPU-only torch first, from its own index (the PyPI wheel would pull CUDA), then the Neuron
# packages at the manifest's exact builds from the Neuron index (the loader refuses any other), both
# under the constraints that pin the framework wheels beneath them (torch, torch-xla, libneuronxla).
COPY app/constraints/neuron.txt /opt/neuron-constraints.txt
RUN python3.11 -m venv /opt/venv \
 && pip install --no-cache-dir -c /opt/neuron-constraints.txt --index-url https://download.pytorch.org/whl/cpu \
    "torch==${TORCH}" \
 && pip install --no-cache-dir -c /opt/neuron-constraints.txt --extra-index-url https://pip.repos.neuron.amazonaws.com \
    "neuronx-cc==${NEURONX_CC}" "torch-neuronx==${TORCH_NEURONX}" "neuronx-distributed==${NEURONX_DISTRIBUTED}" "transformers==${TRANSFORMERS}" "flask==3.1.3" "gunicorn==27.0.1" "pydantic==2.14.4" "pillow==13.0.0" "soundfile==0.14.0" "soxr==1.1.0"

# Weights and compile in a throwaway stage: the checkpoint and the compiler's scratch stay out of the base.
FROM toolchain AS compile
ENV HF_HOME=/opt/hf \
    NEURON_COMPILE_CACHE_URL=/var/tmp/neuron-compile-cache
# The checkpoint, downloaded on the build host (its HF_TOKEN stays there), copied in.
COPY checkpoint/ /opt/hf/hub/models--google--gemma-4-12B-it/
ENV HF_HUB_OFFLINE=1
COPY app/ /opt/gemma4/
WORKDIR /opt/gemma4
RUN ["python", "build.py", "compile", "manifest.yaml", "--variant", "tp2-48k", "--backend", "neuron", "--out", "/opt/gemma4/artifacts/tp2-48k"]

FROM toolchain
# One layer per artifact, before the code: a code change never re-uploads an artifact.
COPY --from=compile /opt/gemma4/artifacts/tp2-48k/ /opt/gemma4/artifacts/tp2-48k/
# The build tools (build.py compile / verify / doctor) and the modules they import; the server lives in slim.
COPY app/ /opt/gemma4/
WORKDIR /opt/gemma4
# `docker run --device /dev/neuron0 --ipc=host IMAGE doctor` runs build.py's command (the slim images,
# which add the server, also serve it); any other command runs as given.
ENTRYPOINT ["bash", "/opt/gemma4/gemma4_port/images/entrypoint.sh"]
LABEL org.opencontainers.image.source="https://example.invalid/gemma4-inf2" \
    org.opencontainers.image.version="0.1.0" \
    org.opencontainers.image.revision="0000000000000000000000000000000000000000" \
    org.opencontainers.image.created="2026-01-01T00:00:00Z" \
    org.opencontainers.image.base.name="ubuntu:22.04" \
    gemma4-inf2.flavour="neuron" \
    gemma4-inf2.variants="tp2-48k" \
    gemma4-inf2.compile-swap-gib.tp2-48k="221"
