"""The app factory: liveness, readiness (a failed self-test, a drain), routing and size errors,
the API key and the metrics, through Flask's test client."""

from __future__ import annotations

import shutil
import threading
import time

from runtime.api.state import server_state
from runtime.generate.engine import State
from runtime.http.app import create_app
from runtime.settings import ServerSettings
from support.artifact_copies import with_wrong_golden
from support.http import CHAT, COMPLETIONS, HI, MODEL, assert_error, client, engine, settings, sse_events  # noqa: F401


def test_health_ready_and_models(client):
    assert client.get("/health").get_json() == {"status": "alive", "state": "ready"}
    ready = client.get("/ready")
    assert ready.status_code == 200 and ready.get_json()["model"] == MODEL
    models = client.get("/v1/models").get_json()
    assert [m["id"] for m in models["data"]] == [MODEL] and models["object"] == "list"
    assert client.get(f"/v1/models/{MODEL}").get_json()["id"] == MODEL
    assert_error(client.get("/v1/models/gpt-4"), 404, "model", "model_not_found")


def test_routing_and_size_errors_are_json(client, settings):
    assert_error(client.get("/nope"), 404, code="not_found")
    resp = client.get(CHAT)
    assert_error(resp, 405, code="method_not_allowed")
    assert "POST" in resp.headers["Allow"]
    big = b'{"model": "x", "prompt": "' + b"a" * settings.max_body_bytes + b'"}'
    assert_error(client.post(COMPLETIONS, data=big), 413, code="request_entity_too_large")


def test_api_key(settings, engine):
    keyed = create_app(settings.model_copy(update={"api_key": "sekret"}), engine).test_client()
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    resp = keyed.post(COMPLETIONS, json=body)
    assert_error(resp, 401, code="invalid_api_key")
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert_error(keyed.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    assert keyed.post(COMPLETIONS, json=body, headers={"Authorization": "Bearer sekret"}).status_code == 200
    for open_path in ("/health", "/ready", "/metrics"):
        assert keyed.get(open_path).status_code == 200


def test_metrics_count_requests_by_endpoint_and_status(client):
    client.post(CHAT, data=b"{")
    client.post(COMPLETIONS, json={"model": MODEL, "prompt": "hi", "max_tokens": 3, "temperature": 0})
    text = client.get("/metrics").get_data(as_text=True)
    assert 'gemma4_requests_total{endpoint="/v1/chat/completions",status="400"}' in text
    assert 'gemma4_requests_total{endpoint="/v1/completions",status="200"}' in text
    for name in (
        "gemma4_queue_depth",
        "gemma4_busy_slots",
        "gemma4_time_to_first_token_seconds_count",
        "gemma4_token_latency_seconds_count",
        "gemma4_tokens_generated_total",
    ):
        assert f"\n{name}" in text


def test_ready_stays_503_after_a_failed_self_test(compiled, tmp_path):
    folder = with_wrong_golden(compiled("tiny-e2b", "fp32"), tmp_path / "planted")
    app = create_app(ServerSettings(artifact=folder))  # its own engine, loading in the background
    client = app.test_client()
    engine = server_state(app).engine
    try:
        assert client.get("/health").status_code == 200  # at once, while loading
        early = client.get("/ready")
        assert early.status_code == 503 and early.get_json()["state"] in ("loading", "self-test")
        assert engine.wait(300) is State.FAILED
        for _ in range(2):
            ready = client.get("/ready")
            assert ready.status_code == 503
            assert ready.get_json()["state"] == "failed" and "golden prompt" in ready.get_json()["reason"]
        err = assert_error(client.post(CHAT, json={"model": MODEL, "messages": HI}), 503, code="not_ready")
        assert "failed" in err["message"]
        health = client.get("/health")  # liveness: restart it (the startup probe waits on /ready)
        assert health.status_code == 503 and "engine thread is not running" in health.get_json()["reason"]
    finally:
        engine.close()


def test_drain_refuses_new_requests_and_finishes_those_in_flight(compiled, monkeypatch):
    app = create_app(ServerSettings(artifact=compiled("tiny-e2b", "fp32"), queue_max=2))
    client, engine = app.test_client(), server_state(app).engine
    try:
        assert engine.wait(300) is State.READY
        gate, decode = threading.Event(), engine.model.runner.decode
        monkeypatch.setattr(engine.model.runner, "decode", lambda tokens: gate.wait(30) and decode(tokens))
        body = {"model": MODEL, "messages": HI, "max_tokens": 8, "stream": True, "temperature": 0}
        in_flight = client.post(CHAT, json=body, buffered=False)
        engine.drain()
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.get_json()["state"] == "draining"
        refused = client.post(CHAT, json=body)
        assert_error(refused, 503, code="not_ready")
        assert refused.headers["Retry-After"]
        assert client.get("/health").status_code == 200 and not engine.idle
        gate.set()
        events = sse_events(in_flight.get_data())
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert engine.idle
    finally:
        engine.close()


def test_liveness_fails_while_a_device_call_is_stuck(compiled, monkeypatch):
    app = create_app(ServerSettings(artifact=compiled("tiny-e2b", "fp32")))
    client, engine = app.test_client(), server_state(app).engine
    try:
        assert engine.wait(300) is State.READY
        monkeypatch.setattr("runtime.generate.engine.STUCK_AFTER_S", 0.2)
        gate, decode = threading.Event(), engine.model.runner.decode
        monkeypatch.setattr(engine.model.runner, "decode", lambda tokens: gate.wait(30) and decode(tokens))
        stream = client.post(
            CHAT, json={"model": MODEL, "messages": HI, "max_tokens": 4, "stream": True}, buffered=False
        )
        time.sleep(0.5)
        stuck = client.get("/health")
        assert stuck.status_code == 503 and "device call" in stuck.get_json()["reason"]
        gate.set()
        stream.get_data()
        assert client.get("/health").status_code == 200
    finally:
        engine.close()


def test_a_job_that_fails_in_the_engine_fails_alone_and_the_engine_goes_on(client, engine, monkeypatch):
    """Any failure of one request's own work in the engine thread ends that request (a 500 naming no
    internals), never the engine: the next request is served and liveness holds."""
    output = engine._scheduler.output
    running = output.running

    def broken(job):
        if job.max_tokens == 3:  # this request only
            raise RuntimeError("a fault in one request's sampling state")
        return running(job)

    monkeypatch.setattr(output, "running", broken)
    failed = client.post(COMPLETIONS, json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
    err = assert_error(failed, 500, code="engine_error")
    assert "fault" not in err["message"]
    assert engine.state is State.READY and client.get("/health").status_code == 200
    served = client.post(COMPLETIONS, json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert served.status_code == 200


def test_an_empty_rendered_prompt_is_a_400_and_a_request_template_needs_the_operator(settings, engine):
    body = {"model": MODEL, "messages": HI, "max_tokens": 2, "chat_template_kwargs": {"chat_template": '{{ "" }}'}}
    assert_error(
        create_app(settings, engine).test_client().post(CHAT, json=body), 400, "chat_template_kwargs.chat_template"
    )
    trusting = settings.model_copy(
        update={"requests": settings.requests.model_copy(update={"trust_request_chat_template": True})}
    )
    resp = create_app(trusting, engine).test_client().post(CHAT, json=body)
    assert_error(resp, 400, "messages", "empty_prompt")
    assert engine.state is State.READY


def test_probes_name_no_paths_when_loading_failed(compiled, tmp_path):
    folder = tmp_path / "artifact"
    shutil.copytree(compiled("tiny-e2b", "fp32"), folder)
    (folder / "config.json").write_text("{}")  # a digest that no longer matches: the load names the file
    app = create_app(ServerSettings(artifact=folder))
    client, engine = app.test_client(), server_state(app).engine
    try:
        assert engine.wait(300) is State.FAILED
        assert str(tmp_path) not in engine.reason and "<artifact>" in engine.reason, engine.reason
        for path in ("/ready", "/health"):
            body = client.get(path).get_data(as_text=True)
            assert client.get(path).status_code == 503 and str(tmp_path) not in body
    finally:
        engine.close()
