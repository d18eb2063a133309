"""Images through the OpenAI API on the tiny multimodal artifact, driven by the official `openai`
client: the server's greedy tokens equal transformers' Gemma4ForConditionalGeneration for the same
image, /tokenize counts the soft tokens, a repeated image keeps its prefilled KV (and only the same
bytes do), and every limit is a 400 naming itself."""

from __future__ import annotations

import base64
import http.server
import io
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import openai
import pytest
import soundfile
from PIL import Image
from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil, Gemma4Processor

from contract.artifact import AUDIO_PROCESSOR, IMAGE_PROCESSOR
from gemma4_port.verify.reference import load_reference, reference_greedy
from runtime.api.handling import token_bytes
from runtime.http.app import create_app
from runtime.settings import MediaLimits, ServerSettings
from support.engines import ready
from support.http import openai_client
from support.tls import https_server, make_certificates

STEPS = 6


def png(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


PHOTO, OTHER = png(61, 45, 0), png(61, 45, 1)  # the same size: the same placeholder ids, other bytes


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def ask(text: str, *images: str) -> list[dict]:
    parts = [{"type": "text", "text": text}, *({"type": "image_url", "image_url": {"url": u}} for u in images)]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def engine(compiled):
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "image"))) as eng:
        yield eng


def client(engine, **media) -> openai.OpenAI:
    """The openai client on an app over the shared engine, with these media limits."""
    return openai_client(engine, media=MediaLimits(**media))


def image_reference(engine):
    """(prompt ids, greedy tokens) of transformers' model for a question about images, in order: the
    checkpoint's own image processor, each placeholder expanded as Gemma4Processor expands it."""
    tok, checkpoint = engine.tokenizer, Path(engine.model.meta.checkpoint)
    model = load_reference(checkpoint)
    budget = engine.geometry.vision.max_soft_tokens
    processor = Gemma4ImageProcessorPil.from_pretrained(str(checkpoint), max_soft_tokens=budget)

    def run(text: str, *images: bytes) -> tuple[list[int], list[int]]:
        parts = [{"type": "text", "text": text}, *({"type": "image"} for _ in images)]
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False
        )
        features = []
        for image in images:
            out = processor(images=[Image.open(io.BytesIO(image))], return_tensors="pt")
            soft = tok.boi_token + "\0" * int(out["num_soft_tokens_per_image"][0]) + tok.eoi_token
            prompt = prompt.replace(tok.image_token, soft, 1)  # "\0" for now: the next image's is the next left
            features.append({k: out[k] for k in ("pixel_values", "image_position_ids")})
        ids = tok(prompt.replace("\0", tok.image_token), add_special_tokens=False).input_ids
        return ids, reference_greedy(model, ids, STEPS, images=features)[0]

    return run


@pytest.fixture(scope="module")
def reference(engine):
    return image_reference(engine)


def server_tokens(oai: openai.OpenAI, engine, messages) -> tuple[list[bytes], int]:
    r = oai.chat.completions.create(
        model=engine.model_name,
        messages=messages,
        max_tokens=STEPS,
        temperature=0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    return [bytes(t.bytes) for t in r.choices[0].logprobs.content], r.usage.prompt_tokens


def reused(engine) -> float:
    return engine.metrics.registry.get_sample_value("gemma4_prefix_tokens_reused_total")


def encoder_runs(engine) -> float:
    """The image encoder runs /metrics counted (gemma4_encoder_seconds{kind="image"})."""
    return engine.metrics.registry.get_sample_value("gemma4_encoder_seconds_count", {"kind": "image"}) or 0.0


def test_greedy_with_an_image_equals_transformers(engine, reference):
    oai, as_bytes = client(engine), token_bytes(engine)
    ids, tokens = reference("What is this?", PHOTO)
    got, prompt_tokens = server_tokens(oai, engine, ask("What is this?", data_url(PHOTO)))
    assert got == [as_bytes(t) for t in tokens]
    assert prompt_tokens == len(ids) and ids.count(engine.tokenizer.image_token_id) == 63


def test_tokenize_counts_the_soft_tokens(engine, reference):
    ids, _ = reference("What is this?", PHOTO)
    r = (
        create_app(engine.settings, engine)
        .test_client()
        .post("/tokenize", json={"model": engine.model_name, "messages": ask("What is this?", data_url(PHOTO))})
    )
    assert r.status_code == 200 and r.get_json()["tokens"] == ids and r.get_json()["count"] == len(ids)


def test_a_repeated_image_keeps_its_kv_and_only_the_same_bytes_do(engine, reference):
    """The second question about the same image keeps the image's prefilled positions; another
    image of the same size (the same placeholder ids) keeps none of them, and both answer as
    transformers does."""
    oai, as_bytes = client(engine), token_bytes(engine)
    first, _ = reference("Describe it.", PHOTO)
    server_tokens(oai, engine, ask("Describe it.", data_url(PHOTO)))
    image_end = first.index(engine.tokenizer.image_token_id) + 63

    ids, tokens = reference("Describe it.", PHOTO)  # the same prompt again: all but its last position kept
    before, runs = reused(engine), encoder_runs(engine)
    assert server_tokens(oai, engine, ask("Describe it.", data_url(PHOTO)))[0] == [as_bytes(t) for t in tokens]
    assert reused(engine) - before > image_end and encoder_runs(engine) == runs  # not encoded again

    ids, tokens = reference("Describe it.", OTHER)
    before = reused(engine)
    assert server_tokens(oai, engine, ask("Describe it.", data_url(OTHER)))[0] == [as_bytes(t) for t in tokens]
    assert reused(engine) - before == ids.index(engine.tokenizer.image_token_id)  # up to the image, none of it
    assert encoder_runs(engine) == runs + 1


def test_the_responses_api_takes_input_image(engine):
    oai = client(engine)
    content = [{"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": data_url(PHOTO)}]
    r = oai.responses.create(model=engine.model_name, input=[{"role": "user", "content": content}], max_output_tokens=2)
    chat = oai.chat.completions.create(
        model=engine.model_name, messages=ask("What is this?", data_url(PHOTO)), max_tokens=2
    )
    assert r.usage.input_tokens == chat.usage.prompt_tokens


@pytest.fixture(scope="module")
def seeing_12b(compiled):
    """The 12B-shaped model (an image's soft tokens see each other both ways on its sliding layers,
    whose window is shorter than an image) at tp 2, batch 2."""
    with ready(ServerSettings(artifact=compiled("tiny-12b", "image-tp2"))) as eng:
        yield eng


def test_greedy_with_images_on_the_12b_shape_at_tp2_equals_transformers(seeing_12b):
    engine = seeing_12b
    assert engine.geometry.tp == 2 and engine.geometry.bidirectional_vision
    oai, as_bytes, reference_12b = client(engine), token_bytes(engine), image_reference(engine)
    for images in [(PHOTO,), (PHOTO, png(40, 52, 2))]:
        ids, tokens = reference_12b("What is this?", *images)
        got, prompt_tokens = server_tokens(oai, engine, ask("What is this?", *map(data_url, images)))
        assert prompt_tokens == len(ids) and got == [as_bytes(t) for t in tokens]
    assert ids.count(engine.tokenizer.image_token_id) > 63 + 16  # the second image: more than one window


class OnePNG(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(PHOTO)))
        self.end_headers()
        self.wfile.write(PHOTO)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OnePNG)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/photo.png"
    srv.shutdown()
    srv.server_close()


def test_an_image_url_is_fetched_only_as_the_operator_allows(engine, image_host):
    allowed = {"allowed_domains": ("127.0.0.1",)}
    with pytest.raises(openai.BadRequestError, match="fetches no URLs"):
        client(engine, max_images=8).chat.completions.create(
            model=engine.model_name, messages=ask("?", image_host), max_tokens=1
        )
    with pytest.raises(openai.BadRequestError, match="127.0.0.1, a private, loopback.*FETCH_PRIVATE_ADDRESSES"):
        client(engine, **allowed).chat.completions.create(
            model=engine.model_name, messages=ask("?", image_host), max_tokens=1
        )
    fetched = client(engine, **allowed, fetch_private_addresses=True).chat.completions.create(
        model=engine.model_name, messages=ask("What is this?", image_host), max_tokens=1
    )
    inline = client(engine).chat.completions.create(
        model=engine.model_name, messages=ask("What is this?", data_url(PHOTO)), max_tokens=1
    )
    assert fetched.usage.prompt_tokens == inline.usage.prompt_tokens


def test_an_https_image_is_fetched_with_the_operators_ca_and_refused_without(engine, tmp_path, monkeypatch):
    """An intranet host with a certificate of the operator's own CA: a 400 naming the part and the host
    while the server trusts certifi's roots only, the image itself once GEMMA4_MEDIA_FETCH_CA_BUNDLE
    names the CA."""
    host = "screenshots.internal.test"
    certs = make_certificates(tmp_path, host)
    with https_server(OnePNG, certs) as port:
        real = socket.getaddrinfo
        monkeypatch.setattr(
            socket,
            "getaddrinfo",
            lambda h, *a, **k: (
                [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))] if h == host else real(h, *a, **k)
            ),
        )
        reach = {"allowed_domains": (host,), "fetch_private_addresses": True}
        url = f"https://{host}:{port}/screen.png"
        with pytest.raises(openai.BadRequestError) as info:
            client(engine, **reach).chat.completions.create(
                model=engine.model_name, messages=ask("?", url), max_tokens=1
            )
        assert info.value.body["param"] == "messages.0.content.1.image_url.url"
        assert f"the host '{host}' failed the TLS check (certificate verify failed" in info.value.body["message"]
        fetched = client(engine, **reach, fetch_ca_bundle=certs.ca).chat.completions.create(
            model=engine.model_name, messages=ask("What is this?", url), max_tokens=1
        )
    inline = client(engine).chat.completions.create(
        model=engine.model_name, messages=ask("What is this?", data_url(PHOTO)), max_tokens=1
    )
    assert fetched.usage.prompt_tokens == inline.usage.prompt_tokens


WAV = base64.b64encode(b"RIFF....WAVEfmt ").decode()


def clip(seconds: float) -> str:
    out = io.BytesIO()
    soundfile.write(out, 0.1 * np.sin(np.arange(int(16000 * seconds)) / 7), 16000, format="WAV")
    return base64.b64encode(out.getvalue()).decode()


def hear(text: str, data: str) -> list[dict]:
    audio = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    return [{"role": "user", "content": [{"type": "text", "text": text}, audio]}]


@pytest.fixture(scope="module")
def hearing(compiled):
    with ready(ServerSettings(artifact=compiled("tiny-e2b", "audio"))) as eng:
        yield eng


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.random.default_rng(3).standard_normal(t.size)).astype(
        "float32"
    )


def encoded(wave: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()  # float samples in a wav are read back exactly; mp3 is lossy, so both sides decode it
    soundfile.write(out, wave, 16000, format=fmt.upper(), subtype="FLOAT" if fmt == "wav" else "MPEG_LAYER_III")
    return out.getvalue()


@pytest.fixture(scope="module")
def hearing_reference(hearing):
    """(prompt ids, greedy tokens) of transformers' model for a question about one clip's samples: the
    checkpoint's own feature extractor, the placeholder expanded by Gemma4Processor's own rule."""
    tok, checkpoint = hearing.tokenizer, Path(hearing.model.meta.checkpoint)
    model = load_reference(checkpoint)
    extractor = Gemma4AudioFeatureExtractor.from_pretrained(str(checkpoint))

    def run(text: str, wave: np.ndarray) -> tuple[list[int], list[int]]:
        parts = [{"type": "text", "text": text}, {"type": "audio"}]
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False
        )
        out = extractor([wave], sampling_rate=16000, return_tensors="pt")
        wrap = SimpleNamespace(boa_token=tok.boa_token, audio_token=tok.audio_token, eoa_token=tok.eoa_token)
        ids = tok(
            prompt.replace(tok.audio_token, Gemma4Processor.replace_audio_token(wrap, out, 0)), add_special_tokens=False
        ).input_ids
        features = {k: out[k] for k in ("input_features", "input_features_mask")}
        return ids, reference_greedy(model, ids, STEPS, clips=[features])[0]

    return run


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_greedy_with_a_clip_equals_transformers(hearing, hearing_reference, fmt):
    """The server's greedy tokens for an input_audio part equal transformers' for the samples the
    file holds (an mp3 decoded by libsndfile for the reference, as soundfile reads it)."""
    data = encoded(tone(1.0), fmt)
    wave = soundfile.read(io.BytesIO(data), dtype="float32")[0]
    assert fmt == "mp3" or np.array_equal(wave, tone(1.0))
    ids, tokens = hearing_reference("Hear this.", wave)
    oai, as_bytes = client(hearing), token_bytes(hearing)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hear this."},
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}},
            ],
        }
    ]
    got, prompt_tokens = server_tokens(oai, hearing, messages)
    assert (
        prompt_tokens == len(ids)
        and ids.count(hearing.tokenizer.convert_tokens_to_ids(hearing.tokenizer.audio_token)) > 20
    )
    assert got == [as_bytes(t) for t in tokens]


def test_the_artifact_carries_the_feature_extractor_where_the_server_reads_it(hearing):
    folder = Path(hearing.settings.artifact)
    assert (folder / AUDIO_PROCESSOR / "preprocessor_config.json").is_file()
    assert not (folder / IMAGE_PROCESSOR).exists()  # an audio-only variant: no image processor


def test_an_audio_clip_is_heard_and_one_past_the_encoders_budget_refused(hearing):
    """A 1 s clip: 25 soft tokens between boa and eoa, counted alike by the chat route and /tokenize;
    a 3 s one makes more than the tiny audio encoder's 48 and is a 400 naming both numbers; bad data
    is a 400 naming the part."""
    engine, oai = hearing, client(hearing)
    r = oai.chat.completions.create(model=engine.model_name, messages=hear("Hear this.", clip(1.0)), max_tokens=2)
    counted = (
        create_app(engine.settings, engine)
        .test_client()
        .post("/tokenize", json={"model": engine.model_name, "messages": hear("Hear this.", clip(1.0))})
    )
    audio_id = engine.tokenizer.convert_tokens_to_ids(engine.tokenizer.audio_token)
    assert counted.get_json()["tokens"].count(audio_id) == 25 and r.usage.prompt_tokens == counted.get_json()["count"]
    over = "makes 75 soft tokens; this model's audio encoder takes at most 48"
    with pytest.raises(openai.BadRequestError, match=over):
        oai.chat.completions.create(model=engine.model_name, messages=hear("?", clip(3.0)), max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="input_audio.data: could not be read as wav audio"):
        oai.chat.completions.create(model=engine.model_name, messages=hear("?", WAV), max_tokens=1)


@pytest.mark.parametrize(
    "limits,messages,param,message",
    [
        (
            {"max_images": 1},
            ask("?", data_url(PHOTO), data_url(OTHER)),
            "messages",
            "the request has 2 image parts; the limit is 1 (GEMMA4_MEDIA_MAX_IMAGES)",
        ),
        (
            {"max_image_bytes": 2048},
            ask("?", data_url(PHOTO)),
            "messages.0.content.1.image_url.url",
            "the limit is 2048 (GEMMA4_MEDIA_MAX_IMAGE_BYTES)",
        ),
        (
            {"max_image_pixels": 2000},
            ask("?", data_url(PHOTO)),
            "messages.0.content.1.image_url.url",
            "is 61 x 45 = 2745 pixels; the limit is 2000 (GEMMA4_MEDIA_MAX_IMAGE_PIXELS)",
        ),
        (
            {},
            ask("?", "data:image/png;base64," + base64.b64encode(b"not an image").decode()),
            "messages.0.content.1.image_url.url",
            "not an image in one of the formats",
        ),
        ({}, ask("?", "data:image/png;base64,%%%"), "messages.0.content.1.image_url.url", "not valid base64"),
        (
            {},
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}]}],
            "messages",
            "this model has no audio encoder; it takes image",
        ),
        (
            {},
            [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": data_url(PHOTO)}}]}, *ask("?")],
            "messages.0.content",
            "only user messages carry image_url and input_audio parts",
        ),
        ({}, ask("look: <|image|>"), "messages", "more image placeholders than the request has image parts"),
    ],
)
def test_refusals_name_the_limit_or_the_fault(engine, limits, messages, param, message):
    with pytest.raises(openai.BadRequestError) as info:
        client(engine, **limits).chat.completions.create(model=engine.model_name, messages=messages, max_tokens=1)
    error = info.value.body
    assert info.value.status_code == 400 and message in error["message"] and error["param"] == param


def test_prompt_logprobs_are_refused_with_an_image(engine):
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs: not available for a prompt with images"):
        client(engine).chat.completions.create(
            model=engine.model_name, messages=ask("?", data_url(PHOTO)), max_tokens=1, extra_body={"prompt_logprobs": 1}
        )


def answer(content: list[dict], role: str = "user") -> dict:
    return {"role": role, "content": content}


def look(url: str) -> dict:
    return {"type": "input_image", "image_url": url}


@pytest.mark.parametrize(
    "limits,items,param,message",
    [
        (
            {"max_image_bytes": 2048},
            [
                answer([{"type": "input_text", "text": "?"}]),
                answer([{"type": "input_text", "text": "?"}, look(data_url(PHOTO))]),
            ],
            "input.1.content.1.image_url",
            "the limit is 2048 (GEMMA4_MEDIA_MAX_IMAGE_BYTES)",
        ),
        (
            {"max_images": 1},
            [answer([look(data_url(PHOTO)), look(data_url(OTHER))])],
            "input",
            "the request has 2 image parts; the limit is 1 (GEMMA4_MEDIA_MAX_IMAGES)",
        ),
        (
            {},
            [answer([{"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}])],
            "input",
            "this model has no audio encoder",
        ),
        ({}, [answer([{"type": "input_text", "text": "look: <|image|>"}])], "input", "more image placeholders"),
    ],
)
def test_responses_refusals_name_the_responses_path(engine, limits, items, param, message):
    """A Responses request's media refusals name its own fields (input.N.content.M), never the chat
    request it is served as (messages.N)."""
    with pytest.raises(openai.BadRequestError) as info:
        client(engine, **limits).responses.create(model=engine.model_name, input=items, max_output_tokens=1)
    error = info.value.body
    assert info.value.status_code == 400 and message in error["message"] and error["param"] == param
    assert "messages." not in error["message"]


def test_responses_media_only_in_user_messages(engine):
    with pytest.raises(openai.BadRequestError) as info:
        client(engine).responses.create(
            model=engine.model_name,
            input=[answer([look(data_url(PHOTO))], role="system"), answer([{"type": "input_text", "text": "?"}])],
            max_output_tokens=1,
        )
    error = info.value.body
    assert "only user messages carry input_image and input_audio parts" in error["message"]
    assert error["param"].startswith("input.0") and "messages." not in error["message"]
