"""Images from a manifest: the plan and its Dockerfiles (pure), then the one module that drives the Docker engine."""
