"""The Flask app factory: the OpenAI blueprint, health and readiness, metrics, the API key, and
JSON errors for everything. One app owns one engine."""

from __future__ import annotations

import hmac

from flask import Flask, Response, jsonify, request
from flask.json.provider import DefaultJSONProvider
from prometheus_client import CONTENT_TYPE_LATEST

from runtime.api import openai_errors
from runtime.api.openai_errors import APIError
from runtime.api.routes import bp as openai_bp
from runtime.api.routes import vllm_bp
from runtime.api.state import OPEN_PATHS, ServerState, install
from runtime.generate.engine import Engine, State
from runtime.settings import ServerSettings


def create_app(config: ServerSettings, engine: Engine | None = None) -> Flask:
    """`engine`: an engine to share (tests); by default a new one starts loading in the background."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    assert isinstance(app.json, DefaultJSONProvider)  # Flask's own
    app.json.sort_keys = False  # keys in the order the bodies write them, as OpenAI's
    eng = engine or Engine(config).start()
    state = ServerState(eng, config.requests, media=config.media)
    install(app, state)
    openai_errors.register(app)
    app.register_blueprint(openai_bp)
    app.register_blueprint(vllm_bp)

    @app.before_request
    def require_key():
        if config.api_key is None or request.path in OPEN_PATHS:
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), config.api_key.encode()):
            raise APIError(
                401,
                "missing or wrong API key: send `Authorization: Bearer <key>`",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None

    @app.after_request
    def count(response):
        endpoint = request.url_rule.rule if request.url_rule else "unmatched"
        eng.metrics.requests.labels(endpoint=endpoint, status=str(response.status_code)).inc()
        return response

    @app.get("/health")
    def health():
        """Liveness: 503 (restart me) once the engine thread is dead or stuck in a device call."""
        problem = eng.problem()
        if problem is not None:
            return jsonify({"status": "dead", "state": eng.state.value, "reason": problem}), 503
        return jsonify({"status": "alive", "state": eng.state.value})

    @app.get("/ready")
    def ready():
        """Readiness, in the engine's words (no paths, no exception text: the log has those). From the
        HTTP worker's SIGTERM on, "draining" while the requests it admitted finish."""
        draining = state.draining.is_set() and eng.state is State.READY
        ready = eng.state is State.READY and not draining
        body = {
            "ready": ready,
            "state": State.DRAINING.value if draining else eng.state.value,
            "reason": "the server is shutting down: finishing the requests in flight" if draining else eng.reason,
            "model": eng.model_name,
        }
        return jsonify(body), 200 if ready else 503

    @app.get("/metrics")
    def metrics():
        return Response(eng.metrics.exposition(), content_type=CONTENT_TYPE_LATEST)

    return app
