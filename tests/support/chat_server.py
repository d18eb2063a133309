"""The chat test artifact served in-process, as the chat and Responses tests share it: a live engine
(`engine`), a Flask test client (`client`) and an openai client over it (`oai`)."""

from __future__ import annotations

import pytest

from runtime.http.app import create_app
from runtime.settings import ServerSettings
from support.engines import ready
from support.http import openai_client


@pytest.fixture(scope="module")
def engine(compiled):
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "chat"))) as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine):
    return create_app(engine.settings, engine).test_client()


@pytest.fixture(scope="module")
def oai(engine):
    return openai_client(engine)
