# gemma4-inf2 base, cpu flavour (development and CI): @{ref}
# Builds without internet: the OS image is local (debootstrap + docker import, with Debian's Python
# inside), the Python packages come from a wheelhouse the driver put in the build context, and the
# artifacts (@{variants}) were compiled on the host beforehand with `build.py compile`.

# The wheelhouse is installed in a throwaway stage: the final image gets the venv, not the wheels.
FROM @{from_image} AS venv
COPY wheels/ /tmp/wheels/
RUN @{python} -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --no-cache-dir --find-links /tmp/wheels -r /tmp/wheels/requirements.txt

FROM @{from_image}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
COPY --from=venv /opt/venv /opt/venv
# One layer per artifact, before the code: a code change never re-uploads an artifact.
@{artifacts}
# The build tools (build.py compile / verify) and the modules they import; the server lives in slim.
COPY app/ @{app}/
WORKDIR @{app}
@{labels}
