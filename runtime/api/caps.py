"""What one request may cost, against the operator's caps (`RequestLimits`), checked once its body
has parsed and before anything is templated, compiled or queued. The request schemas keep the API's
own bounds (OpenAI's n <= 128, logprobs <= 5 ...); these are the server's, smaller, configurable.
Each refusal names the field, the request's figure, the cap and its variable."""

from __future__ import annotations

from runtime.api.openai_errors import APIError
from runtime.settings import RequestLimits


def over(param: str, what: str, value: int, cap: int, var: str) -> APIError:
    return APIError(
        400, f"{param}: {what} {value}; this server allows at most {cap} ({var})", param=param, code="over_limit"
    )


def _cap(param: str, what: str, value: int, cap: int, var: str) -> None:
    if value > cap:
        raise over(param, what, value, cap, var)


def check_costs(body, limits: RequestLimits) -> None:
    """The caps of a completion or chat request (a field the body lacks is not checked)."""
    _cap("n", "asks for", body.n, limits.max_n, "GEMMA4_MAX_N")
    best_of = getattr(body, "best_of", None)
    if best_of is not None:
        _cap("best_of", "asks for", best_of, limits.max_n, "GEMMA4_MAX_N")
    stops = body.stop or ()
    _cap("stop", "has stop strings:", len(stops), limits.max_stops, "GEMMA4_MAX_STOPS")
    for i, stop in enumerate(stops):
        _cap(f"stop.{i}", "has bytes:", len(stop.encode()), limits.max_stop_bytes, "GEMMA4_MAX_STOP_BYTES")
    ids = body.stop_token_ids or ()
    _cap("stop_token_ids", "has ids:", len(ids), limits.max_stop_token_ids, "GEMMA4_MAX_STOP_TOKEN_IDS")
    _cap("logit_bias", "has entries:", len(body.logit_bias or {}), limits.max_logit_bias, "GEMMA4_MAX_LOGIT_BIAS")
    for param in ("top_logprobs", "prompt_logprobs"):
        value = getattr(body, param, None)
        if value is not None:
            _cap(param, "asks for alternatives:", value, limits.max_top_logprobs, "GEMMA4_MAX_TOP_LOGPROBS")
    _cap("tools", "has tools:", len(getattr(body, "tools", None) or ()), limits.max_tools, "GEMMA4_MAX_TOOLS")
    check_messages(getattr(body, "messages", None) or (), limits)


def check_messages(messages, limits: RequestLimits) -> None:
    """Templating costs time linear in the messages (with the shipped templates: docs/serving.md has
    the figures), so their number is capped before the template runs."""
    _cap("messages", "has messages:", len(messages), limits.max_messages, "GEMMA4_MAX_MESSAGES")


def check_total(runs: int, max_tokens: int, limits: RequestLimits) -> None:
    """The tokens one request may have the model generate: its runs (n, or best_of) x max_tokens."""
    total = runs * max_tokens
    if total > limits.max_total_tokens:
        raise APIError(
            400,
            f"max_tokens: {runs} run(s) (n, or best_of) x {max_tokens} tokens = {total}; this server allows at "
            f"most {limits.max_total_tokens} generated tokens per request (GEMMA4_MAX_TOTAL_TOKENS)",
            param="max_tokens",
            code="over_limit",
        )


def default_budget(runs: int, limits: RequestLimits) -> int:
    """The most tokens each run may generate when the request does not say (the context's room is
    capped by this too)."""
    return max(1, limits.max_total_tokens // runs)
