"""The tiny model family: deterministic checkpoints, the tokenizer, and the chat template with tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, Qwen2ForCausalLM

from orchard.engines.tiny import (
    BUILD_INFO_FILE,
    TINY_MODELS,
    TOKENIZER_REVISION,
    build_tiny_checkpoint,
    build_tiny_tokenizer,
    ensure_tiny_checkpoint,
    is_tiny_name,
    tokenizer_corpus,
)
from orchard.engines.tool_parsing import parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


def test_checkpoint_is_a_normal_hf_directory(checkpoint: Path) -> None:
    files = sorted(p.name for p in checkpoint.iterdir())
    assert files == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        BUILD_INFO_FILE,
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    parameters = sum(p.numel() for p in model.parameters())
    assert isinstance(model, LlamaForCausalLM)
    assert 1_000_000 <= parameters <= 5_000_000
    assert 256 < len(tokenizer) <= 2048
    assert model.config.vocab_size == len(tokenizer)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert json.loads((checkpoint / BUILD_INFO_FILE).read_text()) == {
        "name": "tiny-llama",
        "seed": 0,
        "parameters": parameters,
    }


def test_build_is_deterministic(checkpoint: Path, tmp_path: Path) -> None:
    again = build_tiny_checkpoint("tiny-llama", tmp_path / "again", seed=0)
    other = build_tiny_checkpoint("tiny-llama", tmp_path / "other", seed=1)
    for path in checkpoint.iterdir():
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name
    assert (other / "model.safetensors").read_bytes() != (checkpoint / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (checkpoint / "tokenizer.json").read_bytes()


def test_family_members_and_cache(tmp_path: Path) -> None:
    assert sorted(TINY_MODELS) == ["tiny-llama", "tiny-llama-32k", "tiny-llama-8k", "tiny-llama-micro", "tiny-qwen2"]
    hidden = TINY_MODELS["tiny-llama"].hidden_size
    for name, context in (("tiny-llama-8k", 8192), ("tiny-llama-32k", 32768)):
        long = AutoConfig.from_pretrained(build_tiny_checkpoint(name, tmp_path / name))
        assert (long.max_position_embeddings, long.hidden_size) == (context, hidden)
    assert is_tiny_name("tiny-qwen2") and not is_tiny_name("/models/tiny-qwen2")
    built = ensure_tiny_checkpoint("tiny-qwen2", tmp_path, seed=3)
    assert built == tmp_path / f"tiny-qwen2-seed3-tok{TOKENIZER_REVISION}"  # a new tokenizer never reuses a build
    assert isinstance(AutoModelForCausalLM.from_pretrained(built), Qwen2ForCausalLM)
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_checkpoint("tiny-qwen2", tmp_path, seed=3) == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp  # found in the cache, not rebuilt
    with pytest.raises(ValueError, match="unknown tiny model 'tiny-gpt'"):
        build_tiny_checkpoint("tiny-gpt", tmp_path / "x")


def test_the_tokenizer_allows_the_longest_context_and_its_ids_do_not_depend_on_it() -> None:
    """``model_max_length`` (and the cache key) follow the family's longest context; token ids never do."""
    tokenizer = build_tiny_tokenizer()
    assert tokenizer.model_max_length == max(spec.max_position_embeddings for spec in TINY_MODELS.values()) == 32768
    text = tokenizer_corpus()
    ids = tokenizer.encode(text, add_special_tokens=False)
    tokenizer.model_max_length = 2048
    assert tokenizer.encode(text, add_special_tokens=False) == ids


def test_the_32k_member_loads_with_sdpa_attention(tmp_path: Path) -> None:
    """A ~24k-token prompt is prefilled by SDPA in ~10 s and ~1.3 GB on 2 CPU cores; eager attention would hold the
    full score matrices (~10 GB at 24k tokens), so the default attention of the loaded checkpoint is pinned here."""
    model = AutoModelForCausalLM.from_pretrained(build_tiny_checkpoint("tiny-llama-32k", tmp_path / "32k"))
    assert (model.config._attn_implementation, model.config.max_position_embeddings) == ("sdpa", 32768)


def test_template_renders_tools_calls_and_results() -> None:
    tokenizer = build_tiny_tokenizer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\nYou may call one or more functions. Their signatures:\n<tools>\n"
        + json.dumps(TOOLS[0])
        + "\n</tools>\nTo call a function, reply with "
        '<tool_call>{"name": <function-name>, "arguments": <json-object>}</tool_call>.<|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        "<|im_end|>\n<|im_start|>tool\n21 C<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = tokenizer.apply_chat_template(messages[:2], add_generation_prompt=False, tokenize=False)
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"


def test_parsed_tool_call_renders_back_token_for_token() -> None:
    """A completion holding a tool call, parsed and sent back as history, re-renders as the same tokens."""
    tokenizer = build_tiny_tokenizer()
    history = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    completion_text = 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    completion = tokenizer.encode(completion_text, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert tokenizer.convert_ids_to_tokens(completion)[-2:] == ["</tool_call>", "<|im_end|>"]
    assert tokenizer.decode(completion, skip_special_tokens=True) == completion_text  # tool markers survive

    parsed = parse_tool_calls(tokenizer.decode(completion, skip_special_tokens=True))
    assert parsed.content == "Checking."
    call = parsed.tool_calls[0]
    reply = {
        "role": "assistant",
        "content": parsed.content,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}],
    }
    next_prompt = tokenizer.encode(
        tokenizer.apply_chat_template(
            [*history, reply, {"role": "tool", "tool_call_id": "c1", "content": "21 C"}],
            tools=TOOLS,
            add_generation_prompt=True,
            tokenize=False,
        ),
        add_special_tokens=False,
    )
    assert next_prompt[: len(prompt) + len(completion)] == prompt + completion
    assert tokenizer.decode(next_prompt[len(prompt) + len(completion) :]) == (
        "\n<|im_start|>tool\n21 C<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_built_in_agents_preamble_is_a_few_hundred_tokens() -> None:
    """The tokenizer is trained on the built-in agent's prompt and tools, so a CPU recipe's episodes are short."""
    from orchard.harnesses.builtin_agent import SYSTEM_PROMPT, TOOLS

    tokenizer = build_tiny_tokenizer()
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "List the files."}]
    preamble = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=True, add_generation_prompt=True)
    assert len(preamble) < 360
    assert tokenizer.tokenize(' "shell", "arguments"') == ['Ġ"', "shell", '",', 'Ġ"', "arguments", '"']
