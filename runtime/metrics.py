"""Prometheus metrics of one server, in a registry of its own (so several apps can live in one
test process); the engine and the app each update their part."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gemma4_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.queue_depth = Gauge("gemma4_queue_depth", "requests waiting for a free slot", registry=r)
        self.busy_slots = Gauge("gemma4_busy_slots", "KV slots serving a request", registry=r)
        self.slots = Gauge("gemma4_slots", "KV slots of the loaded artifact (batch)", registry=r)
        self.ready = Gauge("gemma4_ready", "1 once the self-test passed", registry=r)
        self.ttft = Histogram(
            "gemma4_time_to_first_token_seconds",
            "from accepting a request to its first token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.token_latency = Histogram(
            "gemma4_token_latency_seconds",
            "time between consecutive tokens of a request",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("gemma4_tokens_generated", "tokens generated", registry=r)
        self.encoder_seconds = Histogram(
            "gemma4_encoder_seconds",
            "one image's or audio clip's encoder graph run (part of its request's time to first token)",
            ["kind"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.prefix_requests = Counter(
            "gemma4_prefix_requests",
            "requests given a slot, by whether they kept a "
            "retained prefix's KV (hit) or prefilled the whole prompt (miss)",
            ["result"],
            registry=r,
        )
        self.prefix_reused = Counter(
            "gemma4_prefix_tokens_reused",
            "prompt tokens whose KV a request kept from a retained slot instead of prefilling them",
            registry=r,
        )
        self.prefix_hit_rate = Gauge(
            "gemma4_prefix_hit_rate", "share of requests that kept a retained prefix", registry=r
        )
        self.forks = Counter(
            "gemma4_forks",
            "choices of an n > 1 request started from a copy of another choice's KV instead of a prefill",
            registry=r,
        )
        self.fork_tokens = Counter(
            "gemma4_fork_tokens_saved", "prompt tokens those choices did not prefill", registry=r
        )
        self.spec_steps = Counter(
            "gemma4_spec_verify_steps",
            "speculative steps of one stream: a drafted continuation checked in one model pass",
            ["method"],
            registry=r,
        )
        self.spec_proposed = Counter(
            "gemma4_spec_proposed_tokens", "drafted tokens the model checked", ["method"], registry=r
        )
        self.spec_accepted = Counter(
            "gemma4_spec_accepted_tokens",
            "drafted tokens the model kept (each one a model pass saved)",
            ["method"],
            registry=r,
        )
        self._prefix = {"hit": 0, "miss": 0}

    def watch(self, queue_depth: Callable[[], float], busy_slots: Callable[[], float]) -> None:
        """Read the live values at scrape time instead of tracking every change."""
        self.queue_depth.set_function(queue_depth)
        self.busy_slots.set_function(busy_slots)

    def encoded(self, kind: str, seconds: float) -> None:
        self.encoder_seconds.labels(kind).observe(seconds)

    def prefix_admitted(self, reused: int) -> None:
        """A request got its slot, keeping `reused` positions of a retained prefix (0: none)."""
        result = "hit" if reused else "miss"
        self._prefix[result] += 1
        self.prefix_requests.labels(result).inc()
        self.prefix_reused.inc(reused)
        self.prefix_hit_rate.set(self._prefix["hit"] / (self._prefix["hit"] + self._prefix["miss"]))

    def forked(self, prompt_tokens: int) -> None:
        """A choice started from a copy of another choice's KV of its `prompt_tokens`-token prompt."""
        self.forks.inc()
        self.fork_tokens.inc(prompt_tokens)

    def speculated(self, method: str, proposed: int, accepted: int) -> None:
        """One stream's speculative step: `proposed` drafted tokens checked, `accepted` of them kept."""
        self.spec_steps.labels(method).inc()
        self.spec_proposed.labels(method).inc(proposed)
        self.spec_accepted.labels(method).inc(accepted)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
