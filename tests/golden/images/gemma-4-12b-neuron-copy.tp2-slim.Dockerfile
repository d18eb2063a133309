# gemma4-inf2 tp2-slim (neuron): gemma4-inf2/gemma-4-12b:tp2-slim, serving tp2-48k
# Only the server and the contract it shares with the build: a server change rebuilds and pushes this
# thin layer, never the base. The base keeps its own copy of contract/ and runtime/model/ for its
# build tools; the server imports both packages from /app (PYTHONPATH).
FROM gemma4-inf2/gemma-4-12b@sha256:abababababababababababababababababababababababababababababababab
RUN groupadd --system --gid 10001 gemma4 \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent gemma4
COPY server/ /app/
ENV GEMMA4_ARTIFACT="/opt/gemma4/artifacts/tp2-48k" \
    GEMMA4_BACKEND="neuron" \
    GEMMA4_MODEL_NAME="gemma-4-12b" \
    GEMMA4_HOST="0.0.0.0" \
    GEMMA4_PORT="8080" \
    NEURON_RT_VISIBLE_CORES="0,1" \
    PYTHONPATH="/app"
WORKDIR /app
USER 10001:10001
EXPOSE 8080
# /ready turns 200 only after the server's self-test (golden tokens through the real graphs).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ['GEMMA4_PORT'], timeout=4)"]
CMD ["python", "-m", "runtime.serve"]
LABEL org.opencontainers.image.source="https://example.invalid/gemma4-inf2" \
    org.opencontainers.image.version="0.1.0" \
    org.opencontainers.image.revision="0000000000000000000000000000000000000000" \
    org.opencontainers.image.created="2026-01-01T00:00:00Z" \
    org.opencontainers.image.base.name="gemma4-inf2/gemma-4-12b:latest" \
    gemma4-inf2.flavour="neuron" \
    gemma4-inf2.variants="tp2-48k" \
    org.opencontainers.image.base.digest="sha256:abababababababababababababababababababababababababababababababab"
