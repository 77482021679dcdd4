"""The built-in tiny model family: small random-init Llama/Qwen2 checkpoints and a tokenizer built in code.

Nothing can be downloaded from a model hub on the machines Orchard is developed and tested on, so CPU tests, the
CPU demo and the engine benchmark use checkpoints built here, deterministically from a seed:

- the **tokenizer** is a byte-level BPE trained by ``tokenizers`` on a small built-in corpus (English, JSON tool
  calls, shell and Python, and the built-in agent's system prompt and tool list with the JSON of its tool calls and
  results; ~660 tokens in all, so most words are a piece or two), with ChatML special tokens
  (``<|endoftext|>`` as padding, ``<|im_start|>``, ``<|im_end|>`` as end of turn) and two atomic, non-special tokens
  ``<tool_call>`` / ``</tool_call>`` that decode to text, so tool calls survive ``skip_special_tokens``;
- the **chat template** (``TINY_CHAT_TEMPLATE``) renders the tool list into the system turn, an assistant's tool
  calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and a tool result as a ``tool`` turn;
- the **model** is a ``LlamaConfig`` (or ``Qwen2Config``) of ~3M parameters initialised from ``seed``.

``build_tiny_checkpoint`` writes an ordinary Hugging Face checkpoint directory (``config.json``,
``model.safetensors``, tokenizer files, ``chat_template.jinja``), so the engine loads a tiny model through exactly
the code path it uses for any other checkpoint. Building is deterministic: the same name and seed give byte-identical
weights and tokenizer files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.utils import logging as hf_logging

from orchard.harnesses.builtin_agent import SYSTEM_PROMPT as AGENT_SYSTEM_PROMPT
from orchard.harnesses.builtin_agent import TOOLS as AGENT_TOOLS
from orchard.logging import get_logger

log = get_logger("engines.tiny")

PAD_TOKEN = "<|endoftext|>"  # noqa: S105 - a token, not a password
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
TEXT_TOKENS = (TOOL_CALL_START, TOOL_CALL_END)
BPE_VOCAB_SIZE = 1024
BUILD_INFO_FILE = "orchard_tiny.json"

TINY_CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\nYou may call one or more functions. Their signatures:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\\n' -}}{%- endfor -%}"
    "{{- '</tools>\\nTo call a function, reply with <tool_call>{\"name\": <function-name>, '"
    " + '\"arguments\": <json-object>}</tool_call>.<|im_end|>\\n' -}}"
    "{%- elif messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role != 'system' or not loop.first -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set function = call.function if call.function is defined else call -%}"
    "{{- '<tool_call>{\"name\": ' + function.name | tojson + ', \"arguments\": ' -}}"
    "{%- if function.arguments is string -%}{{- function.arguments -}}"
    "{%- else -%}{{- function.arguments | tojson -}}{%- endif -%}"
    "{{- '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""ChatML with tools: tool list in the system turn, ``<tool_call>`` blocks in assistant turns, ``tool`` turns."""

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A tiny model can still speak in tokens, one after another.
You are a helpful assistant. Answer the question, then stop. If a tool helps, call it with JSON arguments.
The user asked for the weather in Paris. The assistant called a function and read the result back.
Run the tests, read the failure, fix the bug, and run the tests again until they pass.
def add(a: int, b: int) -> int:
    return a + b

class Parser:
    def parse(self, text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line]

$ pytest -x tests/test_parse.py
FAILED tests/test_parse.py::test_empty - IndexError: list index out of range
$ git diff --stat
$ ls -la src/ && cat README.md | head -n 20
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "shell", "arguments": {"command": "ls -la"}}
{"name": "read_file", "arguments": {"path": "src/main.py"}}
{"type": "function", "function": {"name": "search", "description": "Search the web.", "parameters": {"type": \
"object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
The temperature is 21 degrees and the sky is clear. Tomorrow it will rain in the morning.
Schedule a meeting with Alice on Monday at 10:00 and send her an email with the agenda.
Open the browser, search for the page, click the first link and read the title.
0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14 -1 true false null
"""

AGENT_CORPUS_REPEATS = 3
"""The agent text is repeated so its words pass ``min_frequency`` and become whole tokens."""


def _agent_corpus() -> str:
    """What the built-in agent sends on every call: its system prompt, the tool list as the chat template renders it,
    and the JSON of tool calls and results.

    A tiny model learns from scratch; with this text in the tokenizer's corpus the agent's ~1,800-character preamble
    is ~320 tokens instead of ~650, which halves the tokens of a CPU recipe's episode and shortens what attention
    has to search through to find the instruction and the tool output.
    """
    tools = "\n".join(json.dumps(tool) for tool in AGENT_TOOLS)
    lines = [
        AGENT_SYSTEM_PROMPT,
        f"# Tools\nYou may call one or more functions. Their signatures:\n<tools>\n{tools}\n</tools>",
        'To call a function, reply with <tool_call>{"name": <function-name>, "arguments": <json-object>}</tool_call>.',
        '{"name": "shell", "arguments": {"command": "cat notes.txt"}}',
        '{"name": "submit", "arguments": {"summary": "done"}}',
        '{"exit_code": 0, "output": "x: 1\\n"}',
        '{"status": "submitted"}',
        "Write the answer to answer.txt. echo 42 > answer.txt",
        "<|im_start|>system\n<|im_start|>user\n<|im_start|>assistant\n<|im_start|>tool\n",
    ]
    return "\n".join(lines) + "\n"


def tokenizer_corpus() -> str:
    """The text the family's BPE is trained on (the general corpus, then the agent's text)."""
    return _CORPUS + _agent_corpus() * AGENT_CORPUS_REPEATS


@dataclass(frozen=True)
class TinySpec:
    """Shape of one member of the tiny family."""

    architecture: Literal["llama", "qwen2"]
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048


TINY_MODELS: dict[str, TinySpec] = {
    "tiny-llama": TinySpec("llama"),
    "tiny-qwen2": TinySpec("qwen2"),
    "tiny-llama-micro": TinySpec("llama", hidden_size=64, intermediate_size=172, num_hidden_layers=2),
    "tiny-llama-8k": TinySpec("llama", max_position_embeddings=8192),
    "tiny-llama-32k": TinySpec("llama", max_position_embeddings=32768),
}
"""The family: ``tiny-llama`` (~3M parameters), ``tiny-qwen2`` (same shape, Qwen2 blocks), ``tiny-llama-micro``,
``tiny-llama-8k`` (``tiny-llama`` with an 8192-token context, for multi-turn episodes that read whole source files)
and ``tiny-llama-32k`` (a 32768-token context for real coding harnesses: opencode's first prompt is ~16k tokens of
this tokenizer; Claude Code's is ~43k, ~31.5k with its cron, workflow, web-fetch, bundled-skill and background-task
switches off, see ``benchmarks/harness_local_engine.py``)."""

TOKENIZER_REVISION = hashlib.sha256(
    (tokenizer_corpus() + str(max(spec.max_position_embeddings for spec in TINY_MODELS.values()))).encode()
).hexdigest()[:8]
"""Part of a cached checkpoint's directory name: a new corpus or context length never reuses an old build."""


def is_tiny_name(model: str) -> bool:
    """Whether ``model`` names a member of the tiny family (rather than a checkpoint path)."""
    return model in TINY_MODELS


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The family's tokenizer: byte-level BPE trained on the built-in corpus, ChatML specials, the chat template."""
    core = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(tokenizer_corpus().splitlines(keepends=True), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        unk_token=None,
        bos_token=None,
        model_max_length=max(spec.max_position_embeddings for spec in TINY_MODELS.values()),
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(TEXT_TOKENS))
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def tiny_model_config(name: str, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig | Qwen2Config:
    """The transformers config of tiny model ``name`` for ``tokenizer``'s vocabulary."""
    spec = _spec(name)
    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
        "tie_word_embeddings": False,
        "initializer_range": 0.05,
    }
    if spec.architecture == "qwen2":
        return Qwen2Config(**common)
    return LlamaConfig(**common)


def build_tiny_model(name: str, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> PreTrainedModel:
    """A freshly initialised tiny model; the same ``name`` and ``seed`` give identical weights."""
    config = tiny_model_config(name, tokenizer)
    model_cls = Qwen2ForCausalLM if isinstance(config, Qwen2Config) else LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG as it was
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def build_tiny_checkpoint(name: str, dest_dir: Path | str, seed: int = 0) -> Path:
    """Write tiny model ``name`` (weights from ``seed``) as a Hugging Face checkpoint directory; return its path."""
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # "Writing model shards" bars are noise in a server's log
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(name, tokenizer, seed)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    info = {"name": name, "seed": seed, "parameters": sum(p.numel() for p in model.parameters())}
    (dest / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    log.info("tiny checkpoint built", **info, dest=str(dest))
    return dest


def ensure_tiny_checkpoint(name: str, cache_dir: Path | str, seed: int = 0) -> Path:
    """The checkpoint of ``name``/``seed`` under ``cache_dir``, built there on first use.

    The build goes to a private temporary directory renamed into place, so a reader never sees a partial
    checkpoint and two processes building at once both end up with the same complete one.
    """
    dest = Path(cache_dir) / f"{name}-seed{seed}-tok{TOKENIZER_REVISION}"
    if (dest / BUILD_INFO_FILE).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        build_tiny_checkpoint(name, tmp, seed)
        tmp.rename(dest)
    except OSError:
        if not (dest / BUILD_INFO_FILE).is_file():  # not a concurrent builder's win: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _spec(name: str) -> TinySpec:
    try:
        return TINY_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown tiny model {name!r}; the family is {sorted(TINY_MODELS)}") from None
