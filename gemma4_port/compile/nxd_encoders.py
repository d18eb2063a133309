"""The image and audio encoders on the Neuron path: a ModelBuilder model of their own, as NxD
Inference builds a multimodal model's vision encoder with its own ModelBuilder, traced and sharded
apart from the text model's (neuronx-distributed-inference models/image_to_text_model_base.py,
get_vision_builder, compile and load_weights).

Why not keys of the decoder's model: every key of one ModelBuilder model shares its state, so an
encoder graph would take the whole KV as state and return it (a graph that returns none does not
share it), and at tp 2 it would run on both ranks. The encoders read no cache, so their model has
none, and it is built at tp 1: the encoders are replicated, not sharded (docs/architecture/
06-multimodal.md says why from their shapes), and run on rank 0's core. Its keys are `vision` and
`audio`, a bucket per soft-token bucket of each; ModelBuilder routes a call by its inputs' shapes
(model_builder.py build_nxd_model, input_shape_map), so no two buckets of a model may share them
(check_routable, for the decoder's model too). Each key's module holds both encoders: ModelBuilder
shards the checkpoint by the first key's module (model_builder.py shard_checkpoint)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from torch import nn

from contract.dtypes import DTYPES
from contract.layout import ENCODER_MODEL, ENCODER_WEIGHTS, geometry_layout
from gemma4_port.compile.device_kv import load_buffers
from gemma4_port.compile.encoders import encoder_inputs
from gemma4_port.compile.tracing import CompileError, trace_quietly
from gemma4_port.port.audio import AudioEncoder, relative_positions
from gemma4_port.port.lint import check_traced
from gemma4_port.port.vision import VisionEncoder
from gemma4_port.source.checkpoint_files import CheckpointReader


class EncoderGraph(nn.Module):
    """One key's graph: the encoder of its kind, beside the other (whose weights the model shares)."""

    def __init__(self, kind: str, vision: VisionEncoder | None, audio: AudioEncoder | None):
        super().__init__()
        self.kind = kind
        self.vision, self.audio = vision, audio

    def forward(self, *inputs):
        # A tuple of outputs, as every graph of a model returns them: one, the (1, N, H) soft tokens.
        return ((self.vision if self.kind == "vision" else self.audio)(*inputs),)


def _encoders(vision_config, audio_config, hidden: int, dtype: torch.dtype) -> tuple:
    """Both encoders on uninitialised storage (NxD loads the parameters), their buffers from the
    checkpoint; the audio tower's relative position table is its config's, made again."""
    with torch.device("meta"):
        vision = VisionEncoder(vision_config, hidden, dtype) if vision_config is not None else None
        audio = AudioEncoder(audio_config, hidden, dtype) if audio_config is not None else None
    vision = vision.to_empty(device="cpu") if vision is not None else None
    if audio is not None:
        audio = audio.to_empty(device="cpu")
        audio.positions.copy_(relative_positions(audio_config))
    return vision, audio


class EncoderInstance:
    """A ModelBuilder model instance of one encoder key: load_module() builds the encoders with their
    buffers (load_buffers); get() returns the graph and no aliases (an encoder has no state)."""

    def __init__(self, kind: str, ckpt: Path, vision_config, audio_config, hidden: int, dtype: torch.dtype):
        self.kind, self.ckpt, self.hidden, self.dtype = kind, ckpt, hidden, dtype
        self.vision_config, self.audio_config = vision_config, audio_config

    def load_module(self) -> None:
        vision, audio = _encoders(self.vision_config, self.audio_config, self.hidden, self.dtype)
        reader = CheckpointReader(self.ckpt)
        for encoder in (vision, audio):
            if encoder is not None:
                load_buffers(encoder, reader)
        self.module = EncoderGraph(self.kind, vision, audio).eval()

    def get(self, bucket_rank: int, **_) -> tuple[nn.Module, dict]:
        return self.module, {}


def encoder_checkpoint(ckpt: Path, vision_config, audio_config, hidden: int, dtype: torch.dtype) -> dict:
    """Both encoders' tensors at `dtype`, keyed as inside an EncoderGraph."""
    reader = CheckpointReader(ckpt)
    out = {}
    with torch.device("meta"):
        for prefix, encoder in (
            ("vision.", VisionEncoder(vision_config, hidden, dtype) if vision_config is not None else None),
            ("audio.", AudioEncoder(audio_config, hidden, dtype) if audio_config is not None else None),
        ):
            for e in encoder.weight_map() if encoder is not None else ():
                out[prefix + e.name] = reader.get(e.key).to(dtype).contiguous()
    return out


def encoder_examples(geo, vision_table: torch.Tensor | None) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """Each encoder key's bucket example inputs."""
    keys = geometry_layout(geo).encoder_keys
    return {kind: [encoder_inputs(geo, vision_table, graph) for graph in graphs] for kind, graphs in keys.items()}


def shape_key(inputs) -> str:
    """What ModelBuilder's input_shape_map keys a bucket by (model_builder.py build_nxd_model)."""
    return str([list(t.shape) for t in inputs])


def check_routable(examples: dict[str, list[tuple[torch.Tensor, ...]]], names: dict[str, list[str]]) -> None:
    """No two buckets of one ModelBuilder model take inputs of the same shapes: its router keys a call
    by them, and a later bucket's entry replaces an earlier one's (build_nxd_model fills a dict)."""
    seen: dict[str, str] = {}
    for key, buckets in examples.items():
        for inputs, name in zip(buckets, names[key]):
            other = seen.setdefault(shape_key(inputs), name)
            if other != name:
                raise CompileError(
                    f"graphs {other} and {name} of one Neuron model take inputs of the same shapes "
                    f"{shape_key(inputs)}: its router could not tell them apart"
                )


def lint_encoders(build, examples: dict[str, list[tuple[torch.Tensor, ...]]]) -> None:
    """Every encoder bucket traced at its shape and linted, as the CPU path lints them (random weights:
    the lint reads ops and shapes, not values)."""
    dtype = DTYPES[build.geo.dtype]
    vision = VisionEncoder(build.vision, build.geo.hidden, dtype) if build.vision is not None else None
    audio = AudioEncoder(build.audio, build.geo.hidden, dtype) if build.audio is not None else None
    for kind, buckets in examples.items():
        module = EncoderGraph(kind, vision, audio).eval()
        for graph, inputs in zip(geometry_layout(build.geo).encoder_keys[kind], buckets):
            check_traced(trace_quietly(torch.jit.trace, module, inputs), str(graph), build.geo.vocab)


def build_encoders(build, examples, compiler_args: list[str], workdir: Path) -> dict[str, str]:
    """The encoder model through ModelBuilder at tp 1: traced, saved, its checkpoint cut for rank 0."""
    from neuronx_distributed.trace.model_builder import ModelBuilder

    dtype, hidden = DTYPES[build.geo.dtype], build.geo.hidden
    builder = ModelBuilder(
        router=None,
        tp_degree=1,
        compiler_workdir=str(workdir),
        checkpoint_loader=partial(encoder_checkpoint, build.ckpt, build.vision, build.audio, hidden, dtype),
    )
    for kind, inputs in examples.items():
        builder.add(
            key=kind,
            model_instance=EncoderInstance(kind, build.ckpt, build.vision, build.audio, hidden, dtype),
            example_inputs=inputs,
            compiler_args=" ".join(compiler_args),
        )
    model = builder.trace(initialize_model_weights=False)
    torch.jit.save(model, str(build.out / ENCODER_MODEL))
    builder.shard_checkpoint(serialize_path=str(build.out / Path(ENCODER_WEIGHTS).parent))
    return {"encoders": ENCODER_MODEL}
