"""The WSGI entry point gunicorn imports (`runtime.wsgi:app`): settings from the environment, then
the app, whose engine starts loading at once in the background. The only module-level app."""

import logging

from .app import create_app
from .settings import Settings

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

app = create_app(Settings.from_env())
