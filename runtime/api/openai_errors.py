"""OpenAI-style JSON errors: `{"error": {"message", "type", "param", "code"}}` for everything that
goes wrong, routing and size limits included, so no client ever sees an HTML page or a traceback."""

from __future__ import annotations

import logging

from flask import Flask, jsonify, request
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from contract.errors import Gemma4Error
from runtime.log_gate import shown

log = logging.getLogger("gemma4.api")
MAX_PARAM_CHARS = 128
RETRY_AFTER_S = "1"  # what a 503 for a full queue or busy threads tells the client to wait

# OpenAI's error types by status (https://platform.openai.com/docs/guides/error-codes).
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


def error_type(status: int) -> str:
    """OpenAI's type for a status: the listed ones, else any client error is an invalid request."""
    return TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "server_error")


class APIError(Gemma4Error):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": error_type(self.status),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self):
        resp = jsonify(self.body())
        resp.status_code = self.status
        resp.headers.update(self.headers)
        return resp


def from_validation(exc: ValidationError) -> APIError:
    """The first problem of a request body, named by its JSON path."""
    err = exc.errors()[0]
    param = ".".join(str(p) for p in err["loc"])[:MAX_PARAM_CHARS] or None  # a client's key may be long
    if err["type"] == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err['ctx']['error']}", code="invalid_json")
    if err["type"] == "extra_forbidden":
        return APIError(400, f"unsupported parameter {shown(param or '')}", param=param, code="unsupported_parameter")
    if param is None:
        return APIError(400, f"the request body must be a JSON object: {err['msg']}", code="invalid_type")
    msg = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
    return APIError(400, f"{param}: {msg}", param=param, code="invalid_value")


def register(app: Flask) -> None:
    app.register_error_handler(APIError, APIError.response)
    app.register_error_handler(ValidationError, lambda exc: from_validation(exc).response())

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        """werkzeug's routing and size errors, as OpenAI JSON (a 405 keeps its Allow header)."""
        headers = {}
        if isinstance(exc, MethodNotAllowed):
            allowed = ", ".join(sorted(exc.valid_methods or ()))
            message, headers = (
                f"{request.method} is not allowed on {shown(request.path)}; allowed: {allowed}",
                {"Allow": allowed},
            )
        elif isinstance(exc, NotFound):
            message = f"no route {shown(request.path)}; the API is under /v1 (see GET /v1/models)"
        elif isinstance(exc, RequestEntityTooLarge):
            message = (
                f"the request body is larger than the limit of {app.config['MAX_CONTENT_LENGTH']} bytes "
                "(GEMMA4_MAX_BODY_BYTES)"
            )
        else:
            message = exc.description or exc.name
        code = exc.name.lower().replace(" ", "_")  # not_found, method_not_allowed, request_entity_too_large
        return APIError(exc.code or 500, message, code=code, headers=headers).response()

    @app.errorhandler(Exception)
    def internal_error(exc: Exception):
        log.exception("unhandled error")
        return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").response()
