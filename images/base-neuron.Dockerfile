@{syntax}# gemma4-inf2 base, neuron flavour (Inferentia2): @{ref}
# Build on an inf2.8xlarge (or any large x86 host: the compile runs on the CPU, not on the device).
# Host memory for the compile of each variant:
@{swap_comments}
# The image is large (toolchain + artifacts): build and push it once; slim images push only their layer.

FROM @{from_image} AS toolchain
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gnupg @{python} @{python}-venv \
 && install -d -m 0755 /etc/apt/keyrings \
 && curl -fsSL https://apt.repos.neuron.amazonaws.com/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB \
    | gpg --dearmor -o /etc/apt/keyrings/neuron.gpg \
 && . /etc/os-release \
 && echo "deb [signed-by=/etc/apt/keyrings/neuron.gpg] https://apt.repos.neuron.amazonaws.com $VERSION_CODENAME main" \
    > /etc/apt/sources.list.d/neuron.list \
 && apt-get update \
 && apt-get install -y --no-install-recommends aws-neuronx-runtime-lib aws-neuronx-collectives aws-neuronx-tools \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/venv/bin:/opt/aws/neuron/bin:$PATH \
    LD_LIBRARY_PATH=/opt/aws/neuron/lib \
    PYTHONUNBUFFERED=1
# CPU-only torch first, from its own index (the PyPI wheel would pull CUDA), then the Neuron
# packages at the manifest's toolchain pins from the Neuron index.
RUN @{python} -m venv /opt/venv \
 && pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==@{torch}" \
 && pip install --no-cache-dir --extra-index-url https://pip.repos.neuron.amazonaws.com \
    @{neuron_pins} "transformers==@{transformers}" @{requirements}

# Weights and compile in a throwaway stage: the checkpoint and the compiler's scratch stay out of the base.
FROM toolchain AS compile
ENV HF_HOME=/opt/hf \
    NEURON_COMPILE_CACHE_URL=/var/tmp/neuron-compile-cache
@{weights}
COPY app/ @{app}/
WORKDIR @{app}
@{compile}

FROM toolchain
# One layer per artifact, before the code: a code change never re-uploads an artifact.
@{artifacts}
# The build tools (build.py compile / verify) and the modules they import; the server lives in slim.
COPY app/ @{app}/
WORKDIR @{app}
@{labels}
