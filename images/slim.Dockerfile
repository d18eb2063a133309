# gemma4-inf2 @{kind} (@{flavour}): @{ref}, serving @{variants}
# Only the server and the contract it shares with the build: a server change rebuilds and pushes this
# thin layer, never the base. The base keeps its own copy of contract/ and runtime/model/ for its
# build tools; the server imports both packages from @{server} (PYTHONPATH).
FROM @{from_image}
RUN groupadd --system --gid @{uid} gemma4 \
 && useradd --system --uid @{uid} --gid @{uid} --no-create-home --home-dir /nonexistent gemma4
COPY server/ @{server}/
@{env}
WORKDIR @{server}
USER @{uid}:@{uid}
EXPOSE @{port}
# /ready turns 200 only after the server's self-test (golden tokens through the real graphs).
HEALTHCHECK --interval=30s --timeout=5s --start-period=@{start_period} --retries=3 \
    CMD @{healthcheck}
CMD @{cmd}
@{labels}
