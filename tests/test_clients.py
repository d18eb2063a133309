"""The client libraries users point at this server, unchanged, each from a venv of its own
(scripts/clients.sh makes them on first use, all at once), against `build.py serve` of the tiny chat
artifact: openai, openai-agents, langchain-openai, pydantic-ai, instructor, litellm and lm-eval.
Each runs a script of named checks (tests/support/clients/); a check that fails is reported by name
with its reason. Sampled checks run at temperature > 0 over several seeds."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from gemma4_port.bench.server import Server
from support import ROOT

SCRIPTS = Path(__file__).parent / "support" / "clients"
CLIENTS = {  # tool (scripts/clients.sh) -> its script
    "openai": "openai_client.py",
    "openai-agents": "openai_agents_client.py",
    "langchain-openai": "langchain_openai_client.py",
    "pydantic-ai": "pydantic_ai_client.py",
    "instructor": "instructor_client.py",
    "litellm": "litellm_client.py",
    "lm-eval": "lm_eval_client.py",
}
OFFLINE = {  # the clients never reach out of the machine: no telemetry, no model-price downloads, no hub
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "ANONYMIZED_TELEMETRY": "False",
    "LANGCHAIN_TRACING_V2": "false",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "OPENAI_API_KEY": "unused",
}


def make_venv(tool: str) -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts/clients.sh"), tool], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"making the {tool} venv failed: {done.stderr[-3000:]}"


def run_client(tool: str, venv: Future, server: Server, cwd: Path) -> subprocess.CompletedProcess:
    venv.result()
    cmd = ["bash", str(ROOT / "scripts/clients.sh"), tool, str(SCRIPTS / CLIENTS[tool])]
    cmd += [f"{server.url}/v1", server.model, str(server.folder / "tokenizer")]
    env = os.environ | OFFLINE | {"PYTHONPATH": str(SCRIPTS)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(2 * len(CLIENTS)) as p:
        yield p


@pytest.fixture(scope="module")
def venvs(pool):
    """The venvs, made concurrently (downloads overlap) while the server starts."""
    return {tool: pool.submit(make_venv, tool) for tool in CLIENTS}


@pytest.fixture(scope="module")
def server(venvs, compiled, tmp_path_factory):
    with Server(
        compiled("tiny-e2b", "chat"),
        tmp_path_factory.mktemp("clients-server"),
        ready_timeout_s=300,
        env={"OMP_NUM_THREADS": "1", "GEMMA4_QUEUE_MAX": "64"},  # every client at once, lm-eval 4 prompts a request
    ) as s:
        yield s


@pytest.fixture(scope="module")
def runs(pool, venvs, server, tmp_path_factory):
    """Every client's script, all at once (their start-up, seconds of imports each, overlaps)."""
    return {t: pool.submit(run_client, t, venvs[t], server, tmp_path_factory.mktemp(t)) for t in CLIENTS}


@pytest.mark.parametrize("tool", list(CLIENTS))
def test_client_works_unchanged(tool, runs):
    done = runs[tool].result()
    lines = done.stdout.strip().splitlines()
    assert lines, f"{tool}: no report (exit {done.returncode}): {done.stderr[-3000:]}"
    results = json.loads(lines[-1])
    failed = {name: why for name, why in results.items() if why != "ok"}
    assert results and not failed and done.returncode == 0, json.dumps(failed, indent=1) + done.stderr[-2000:]
