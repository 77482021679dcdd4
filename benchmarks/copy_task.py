"""The copy task of ``benchmarks/rl_vs_trl.py``: single-turn prompts with a verifiable reward, and a shared warm start.

A prompt names a digit among two distractors, ``"3/5 copy=7:"``, and the answer is that digit (``"7"``, one token).
Every prompt of the format is 9 tokens of the tiny tokenizer (digits are single tokens and nothing merges across
the separators), so every sample of a training step has the same length. The 1,000 prompts are split once, with a
fixed seed, into a held-out set (``HELD_OUT`` prompts, never trained on) and a training pool.

A randomly initialised tiny model answers with a digit about 1 time in 100 vocabulary entries, too rarely for a
group of 8 to hold a success, so both trainers start from the same **warm start**: the tiny model briefly
fine-tuned (plain torch, fixed seed) to answer every training prompt with a *uniformly random* digit. It learns the
answer's format, not the task: its success is about 1 in 10, and what RL has to learn (copying the named digit,
ignoring the distractors) it has not seen.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from orchard.engines.tiny import build_tiny_model, build_tiny_tokenizer
from orchard.logging import get_logger

log = get_logger("benchmarks.copy_task")

PROMPT_FORMAT = "{a}/{b} copy={d}:"
PROMPT_TOKENS = 9
HELD_OUT = 100
SPLIT_SEED = 1234
"""The held-out split does not depend on ``--seed``: every run is scored on the same prompts."""
WARM_STEPS, WARM_BATCH, WARM_LR = 60, 16, 1e-3


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, the answer that earns the reward, and its token ids."""

    text: str
    target: str
    token_ids: tuple[int, ...]


def copy_reward(completions: list[str], target: list[str], **kwargs: Any) -> list[float]:
    """1.0 where the completion, stripped, is the target digit, else 0.0 (TRL's reward signature).

    >>> copy_reward(["7", " 7", "3", ""], target=["7", "7", "7", "7"])
    [1.0, 1.0, 0.0, 0.0]
    """
    return [float(text.strip() == want) for text, want in zip(completions, target, strict=True)]


def all_prompts(tokenizer: PreTrainedTokenizerBase) -> list[Prompt]:
    """Every prompt of the task, in a fixed order; each is ``PROMPT_TOKENS`` tokens."""
    prompts = []
    for a in range(10):
        for b in range(10):
            for d in range(10):
                text = PROMPT_FORMAT.format(a=a, b=b, d=d)
                ids = tuple(tokenizer.encode(text, add_special_tokens=False))
                if len(ids) != PROMPT_TOKENS:
                    raise ValueError(f"{text!r} is {len(ids)} tokens, the task needs {PROMPT_TOKENS}")
                prompts.append(Prompt(text, str(d), ids))
    return prompts


def split(tokenizer: PreTrainedTokenizerBase) -> tuple[list[Prompt], list[Prompt]]:
    """The training pool and the held-out prompts."""
    prompts = all_prompts(tokenizer)
    held = set(random.Random(SPLIT_SEED).sample(range(len(prompts)), HELD_OUT))  # noqa: S311 - task data
    return [p for i, p in enumerate(prompts) if i not in held], [p for i, p in enumerate(prompts) if i in held]


def training_prompts(pool: list[Prompt], count: int, seed: int) -> list[Prompt]:
    """The sequence of training prompts both trainers see, in order (drawn with replacement from ``pool``)."""
    return random.Random(seed).choices(pool, k=count)  # noqa: S311 - task data


@torch.no_grad()
def greedy_success(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt]) -> float:
    """Fraction of ``prompts`` whose greedy one-token answer earns the reward."""
    was_training = model.training
    model.eval()
    ids = torch.tensor([p.token_ids for p in prompts])
    answers = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1).tolist()
    model.train(was_training)
    texts = [tokenizer.decode([token], skip_special_tokens=True) for token in answers]
    rewards = copy_reward(texts, target=[p.target for p in prompts])
    return sum(rewards) / len(rewards)


def warm_start(model_name: str, pool: list[Prompt], seed: int, dest: Path) -> Path:
    """Build the tiny model from ``seed``, teach it to answer with a random digit, save it (with the tokenizer)."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(model_name, tokenizer, seed).train()
    digits = torch.tensor([tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)  # noqa: S311 - training data
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_LR)
    for _ in range(WARM_STEPS):
        ids = torch.tensor([p.token_ids for p in rng.choices(pool, k=WARM_BATCH)])
        targets = digits[torch.randint(10, (WARM_BATCH,), generator=generator)]
        loss = F.cross_entropy(model(input_ids=ids, use_cache=False).logits[:, -1], targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    log.info("warm start saved", dest=str(dest), steps=WARM_STEPS, final_loss=round(loss.item(), 4))
    return dest
