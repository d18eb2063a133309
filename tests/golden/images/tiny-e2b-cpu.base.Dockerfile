# gemma4-inf2 base, cpu flavour (development and CI): 127.0.0.1:5000/gemma4-inf2/tiny-e2b:latest
# Builds without internet: the OS image is local (debootstrap + docker import, with Debian's Python
# inside), the Python packages come from a wheelhouse the driver put in the build context, and the
# artifacts (fp32) were compiled on the host beforehand with `build.py compile`.

# The wheelhouse is installed in a throwaway stage: the final image gets the venv, not the wheels.
FROM local/debian:bookworm AS venv
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --no-cache-dir --find-links /tmp/wheels -r /tmp/wheels/requirements.txt

FROM local/debian:bookworm
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
COPY --from=venv /opt/venv /opt/venv
# One layer per artifact, before the code: a code change never re-uploads an artifact.
COPY artifacts/fp32/ /opt/gemma4/artifacts/fp32/
# The build tools (build.py compile / verify) and the modules they import; the server lives in slim.
COPY app/ /opt/gemma4/
WORKDIR /opt/gemma4
LABEL org.opencontainers.image.source="https://example.invalid/gemma4-inf2" \
    org.opencontainers.image.version="0.1.0" \
    org.opencontainers.image.revision="0000000000000000000000000000000000000000" \
    org.opencontainers.image.created="2026-01-01T00:00:00Z" \
    org.opencontainers.image.base.name="local/debian:bookworm" \
    gemma4-inf2.flavour="cpu" \
    gemma4-inf2.variants="fp32"
