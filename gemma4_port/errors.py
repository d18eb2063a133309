"""The errors a user can fix: build.py prints these as one line, never as a traceback."""

from runtime.artifact import ArtifactError
from runtime.runner import PromptTooLong
from runtime.settings import SettingsError
from runtime.tokenizer import TokenizerError
from runtime.tp_backend import TensorParallelError
from runtime.versions import NeuronUnavailable

from .bench.errors import BenchError
from .checkpoint import CheckpointError
from .compile import CompileError
from .imageplan import ImageError
from .lint import LintError
from .manifest import ManifestError
from .model import WeightError
from .sharding import ShardingError

USER_ERRORS = (
    ArtifactError, CheckpointError, CompileError, LintError, ManifestError, PromptTooLong, ShardingError,
    TokenizerError, WeightError, TensorParallelError, SettingsError, ImageError, NeuronUnavailable, BenchError,
)
