"""``LocalEngine``: any Hugging Face causal-LM checkpoint directory served with continuous batching, on CPU or GPU.

The ``local`` backend of the engine interface (``orchard.engines.base.Engine``). It owns the tokenizer (prompts
are rendered by the checkpoint's own chat template and tokenized once, here), the
weights being served (a ``ServingModel`` with its policy version) and the ``BatchScheduler`` that generates. The
OpenAI layer (``orchard.engines.openai_api``) turns HTTP requests into ``render_prompt`` + ``submit`` calls, and
``/v1/completions`` echo logprobs into ``score`` (one forward pass of a given sequence, ``orchard.engines.scoring``,
run beside the scheduler on the weights it serves, one sequence at a time); the reloader
(``orchard.engines.reload``) calls ``load_version`` with a downloaded checkpoint to switch weights.

A tiny-family name (``tiny-llama``, see ``orchard.engines.tiny``) is built into a cache directory first, so it is
loaded by the same code as any other checkpoint. Loading refuses, with ``CheckpointError``, a checkpoint whose
weights miss tensors, carry unexpected ones or have other shapes (transformers would otherwise initialise missing
tensors at random, silently), and a new version whose architecture or vocabulary differs from the one served.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import safetensors.torch
import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from orchard.engines.base import Engine
from orchard.engines.batching import BatchScheduler, GenerationHandle, ServingModel
from orchard.engines.config import EngineConfig
from orchard.engines.exceptions import CheckpointError, ContextLengthError, InvalidRequestError
from orchard.engines.openai_api import create_engine_app
from orchard.engines.sampling import SamplingParams
from orchard.engines.scoring import SequenceScores, score_sequence
from orchard.engines.tiny import ensure_tiny_checkpoint, is_tiny_name
from orchard.logging import get_logger

if TYPE_CHECKING:
    from fastapi import FastAPI

    from orchard.engines.reload import PolicyReloader

log = get_logger("engines.local")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_KWARG = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# config keys that say how a checkpoint was saved, not what model it is (a trainer saves use_cache false; serving
# passes use_cache itself)
_CONFIG_PROVENANCE = frozenset({"transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache"})


def resolve_device(device: str) -> torch.device:
    """``auto``: the first CUDA device if there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a GPU, float32 on the CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[dtype]


def resolve_checkpoint(config: EngineConfig) -> Path:
    """The checkpoint directory ``config.model`` names: a tiny-family name is built under ``config.cache_dir``."""
    if is_tiny_name(config.model):
        return ensure_tiny_checkpoint(config.model, config.cache_dir, config.tiny_seed)
    path = Path(config.model)
    if not (path / CONFIG_FILE).is_file():
        raise CheckpointError(
            f"{config.model} is neither a tiny-family name nor a checkpoint directory with config.json"
        )
    return path


def load_model(path: Path, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """Load a causal LM from ``path``; ``CheckpointError`` on missing, unexpected or mis-shaped tensors."""
    hf_logging.disable_progress_bar()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **{_DTYPE_KWARG: dtype})
    except Exception as exc:  # safetensors, OSError, ValueError...: all mean "cannot load this"
        raise CheckpointError(f"cannot load the checkpoint in {path}: {exc}") from exc
    problems = {key: sorted(map(str, value)) for key, value in info.items() if value}
    if problems:
        raise CheckpointError(f"checkpoint in {path} does not match its architecture: {problems}")
    return model.to(device).eval()


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer; it must have a chat template."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise CheckpointError(f"cannot load the tokenizer in {path}: {exc}") from exc
    if not tokenizer.chat_template:
        raise CheckpointError(f"the tokenizer in {path} has no chat template")
    return tokenizer


class LocalEngine(Engine):
    """A checkpoint served by a batching scheduler; see the module docstring."""

    loads_from_memory = True

    def __init__(
        self,
        checkpoint: Path,
        *,
        model_name: str,
        max_batch_size: int = 32,
        max_queue: int = 256,
        prefix_cache_mb: int = 256,
        max_context: int | None = None,
        default_max_tokens: int = 256,
        device: str = "cpu",
        dtype: str = "auto",
        cpu_threads: int | None = None,
        policy_version: int = 0,
    ) -> None:
        self.checkpoint = Path(checkpoint)
        self._model_name = model_name
        self.device = resolve_device(device)
        if cpu_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(cpu_threads)  # process-wide: the engine owns its process's compute
        self.dtype = resolve_dtype(dtype, self.device)
        self.default_max_tokens = default_max_tokens
        self.tokenizer = load_tokenizer(self.checkpoint)
        model = load_model(self.checkpoint, self.device, self.dtype)
        self._reference = model.config
        limit = int(getattr(model.config, "max_position_embeddings", 0) or max_context or 2048)
        self.max_context = min(max_context or limit, limit)
        self.vocab_size = int(model.config.vocab_size)
        self._score_lock = threading.Lock()  # one scoring pass at a time: bounds the memory of full-sequence logits
        self.scheduler = BatchScheduler(
            ServingModel(model, policy_version),
            self.tokenizer,
            eos_token_ids=_eos_token_ids(model, self.tokenizer),
            pad_token_id=_pad_token_id(self.tokenizer),
            max_batch_size=max_batch_size,
            max_queue=max_queue,
            prefix_cache_bytes=prefix_cache_mb * 2**20,
        )
        log.info(
            "engine loaded",
            model=model_name,
            checkpoint=str(self.checkpoint),
            device=str(self.device),
            dtype=str(self.dtype),
            max_context=self.max_context,
            policy_version=policy_version,
            parameters=sum(p.numel() for p in model.parameters()),
        )

    @classmethod
    def from_config(cls, config: EngineConfig) -> LocalEngine:
        """Build the engine ``config`` describes (building a tiny checkpoint first if it names one)."""
        checkpoint = resolve_checkpoint(config)
        return cls(
            checkpoint,
            model_name=config.served_model_name or config.model.rstrip("/").rsplit("/", 1)[-1],
            max_batch_size=config.max_batch_size,
            max_queue=config.max_queue,
            prefix_cache_mb=config.prefix_cache_mb,
            max_context=config.max_context,
            default_max_tokens=config.default_max_tokens,
            device=config.device,
            dtype=config.dtype,
            cpu_threads=config.cpu_threads,
            policy_version=config.policy_version,
        )

    @property
    def model_name(self) -> str:
        """The model id of the API."""
        return self._model_name

    @property
    def policy_version(self) -> int:
        """The version new requests are served with."""
        return self.scheduler.policy_version

    def create_app(self, reloader: PolicyReloader | None = None) -> FastAPI:
        """The OpenAI API app serving this engine (``orchard.engines.openai_api``)."""
        return create_engine_app(self, reloader=reloader)

    def start(self) -> None:
        """Start generating."""
        self.scheduler.start()

    def close(self) -> None:
        """Stop generating; requests still queued or running fail."""
        self.scheduler.stop()

    def render_prompt(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> list[int]:
        """Token ids of ``messages`` (and ``tools``) through the chat template, ready for the assistant's turn."""
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tools=[dict(t) for t in tools] or None,
                add_generation_prompt=True,
                tokenize=False,
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"the chat template cannot render these messages: {exc}", "messages") from exc
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_text(self, text: str) -> list[int]:
        """Token ids of raw ``text`` (no chat template), with the tokenizer's special tokens as vLLM adds them."""
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def check_token_ids(self, token_ids: Sequence[int], param: str = "prompt") -> None:
        """``InvalidRequestError`` naming ``param`` if a token id is outside the model's vocabulary."""
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"token ids {bad[:5]} are outside this model's vocabulary of {self.vocab_size}", param
            )

    def score(self, token_ids: Sequence[int], top_n: int = 0) -> tuple[SequenceScores, int]:
        """Logprob of each token of ``token_ids`` given those before it, and the policy version that scored them.

        Blocking (a forward pass): call it from a worker thread, not the event loop.
        """
        with self._score_lock:  # a reload overwrites a spare model only under this lock (load_version_files)
            serving = self.scheduler.serving
            return score_sequence(serving.model, token_ids, top_n), serving.version

    def completion_budget(self, prompt_tokens: int, requested: int | None) -> int:
        """The ``max_tokens`` to generate: as requested, or the default, within the context that remains."""
        room = self.max_context - prompt_tokens
        if room <= 0:
            raise ContextLengthError(
                f"the prompt is {prompt_tokens} tokens; this model's context is {self.max_context} tokens", "messages"
            )
        if requested is None:
            return min(self.default_max_tokens, room)
        if requested > room:
            raise ContextLengthError(
                f"this model's context is {self.max_context} tokens; you requested {prompt_tokens + requested} "
                f"({prompt_tokens} in the prompt, {requested} for the completion)",
                "max_tokens",
            )
        return requested

    def submit(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> GenerationHandle:
        """Queue a generation (from the event loop); see ``BatchScheduler.submit``."""
        return self.scheduler.submit(prompt_ids, params, n)

    def load_version(self, directory: Path, version: int) -> None:
        """Load the checkpoint in ``directory`` as policy ``version`` and serve it from the next step on.

        A directory with weights but no ``config.json`` is read with the served model's config. Raises
        ``CheckpointError`` (and keeps serving the current version) if the version is not newer, the weights do
        not load, or the architecture or vocabulary differ from the served model's.
        """
        self._check_newer(version)
        directory = Path(directory)
        if not (directory / CONFIG_FILE).is_file():
            self._reference.save_pretrained(directory)
        _check_compatible(json.loads((directory / CONFIG_FILE).read_text()), self._reference.to_dict())
        model = load_model(directory, self.device, self.dtype)
        self.scheduler.install(ServingModel(model, version))

    def load_version_files(self, files: Mapping[str, bytes], version: int) -> bool:
        """``load_version`` from memory: a version of one ``model.safetensors`` whose config is the served one's (or
        absent) and whose tensors are the served model's by name is copied into a replaced version's model that
        nothing uses any more and that has the served config (``BatchScheduler.take_spare``), else into a copy of the
        served model, with no
        file written and no model built from a config. False for anything else (sharded weights, another config,
        tensors named otherwise: a missing one, or names transformers converts on load), which ``load_version``
        then builds, and checks, from a directory. ``CheckpointError`` if the version is not newer, its weights do
        not parse, or a tensor has another shape."""
        weights, config = files.get(WEIGHTS_FILE), files.get(CONFIG_FILE)
        served = self.scheduler.serving.model
        if weights is None or (config is not None and not _same_config(config, served)):
            return False
        self._check_newer(version)
        try:
            tensors = safetensors.torch.load(weights)
        except Exception as exc:  # a safetensors error of any kind means "cannot load this"
            raise CheckpointError(f"cannot load the weights of version {version}: {exc}") from exc
        problems = weight_mismatch(served.state_dict(), tensors)
        if "missing_keys" in problems or "unexpected_keys" in problems:
            return False  # named otherwise: from_pretrained decides
        if problems:
            raise CheckpointError(f"version {version} does not match its architecture: {problems}")
        # not the served model: requests in flight finish on the weights they started with. A replaced version's
        # model that nothing uses any more is overwritten (no allocation); else a copy of the served one (either has
        # the served model's names, shapes and ties, so the check above holds for it)
        spare = self.scheduler.take_spare()
        # a spare built from another config (a version loaded from a directory only matches the served one on the
        # architecture's keys) would run the new weights with its own epsilons, rope or ties
        if (spare is not None and spare.config.to_diff_dict() == served.config.to_diff_dict()
                and not weight_mismatch(spare.state_dict(), tensors)):  # fmt: skip
            with self._score_lock:  # a scoring pass that began on it before it was replaced finishes first
                _assign(spare.state_dict(), tensors)
            model = spare
        else:
            model = copy.deepcopy(served)
            _assign(model.state_dict(), tensors)
        self.scheduler.install(ServingModel(model, version))
        return True

    def _check_newer(self, version: int) -> None:
        current = self.policy_version
        if version <= current:
            raise CheckpointError(f"version {version} is not newer than the version served ({current})")


def _same_config(data: bytes, model: PreTrainedModel) -> bool:
    """Whether ``data`` (a ``config.json``) describes ``model``'s architecture (how it was saved aside)."""
    try:
        new = json.loads(data)
    except ValueError:
        return False  # load_version says what is wrong with it
    if not isinstance(new, dict):
        return False
    served = model.config.to_diff_dict()  # what save_pretrained writes: the values that differ from the defaults
    keys = (set(new) | set(served)) - _CONFIG_PROVENANCE
    return all(new.get(key) == served.get(key) for key in keys)


def weight_mismatch(own: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]) -> dict[str, list[str]]:
    """How ``tensors`` differ from a model's ``own`` state: names missing, unexpected, or of another shape (none:
    an empty dict). A tensor tied to another (one storage, e.g. tied embeddings) may be absent when one of its ties
    is present, as ``save_pretrained`` writes it."""
    ties: dict[tuple[int, tuple[int, ...]], list[str]] = {}
    for name, tensor in own.items():
        ties.setdefault((tensor.data_ptr(), tuple(tensor.shape)), []).append(name)
    missing = sorted(name for names in ties.values() if not any(n in tensors for n in names) for name in names)
    unexpected = sorted(name for name in tensors if name not in own)
    mismatched = sorted(
        name for name, tensor in tensors.items() if name in own and tuple(tensor.shape) != tuple(own[name].shape)
    )
    return {
        kind: names
        for kind, names in (("missing_keys", missing), ("unexpected_keys", unexpected), ("mismatched_keys", mismatched))
        if names
    }


def copy_weights(model: PreTrainedModel, tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """Copy ``tensors`` into ``model``'s own; ``CheckpointError`` (``model`` untouched) if any differs from them
    (``weight_mismatch``)."""
    own = model.state_dict()
    problems = weight_mismatch(own, tensors)
    if problems:
        raise CheckpointError(f"{what} does not match its architecture: {problems}")
    _assign(own, tensors)


def _assign(own: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, tensor in tensors.items():
            own[name].copy_(tensor)


def _check_compatible(new: Mapping[str, Any], served: Mapping[str, Any]) -> None:
    for key in ("architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers"):
        if new.get(key) != served.get(key):
            raise CheckpointError(f"new weights have {key}={new.get(key)!r}, the served model {served.get(key)!r}")


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids if i is not None})


def _pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise CheckpointError("the tokenizer has neither a pad nor an end-of-sequence token")
    return int(pad)
