"""A left-padded batch of running sequences on one model, with a KV cache that sequences join and leave.

This is the tensor side of continuous batching, for any Hugging Face causal LM that takes an attention mask,
explicit ``position_ids`` and a ``DynamicCache``:

- **join** (``prefill``): new prompts are left-padded to a common length and run through the model once, into a
  fresh cache; that cache is then left-padded (or the running one is) so both have the same length, and the two are
  concatenated along the batch dimension;
- **step** (``decode``): one token per sequence, with the attention mask extended by one column and each
  sequence's own position (its count of real tokens), so RoPE sees the positions an unpadded forward pass would;
- **leave** (``keep``): finished rows are dropped from the cache and the mask, and leading columns that are padding
  in every remaining row are cut off, so a long finished sequence does not keep its padding alive.

Padding positions never influence real ones: they are masked out of attention, and their own outputs are ignored.
The cache layout is read and written through ``_kv_layers``/``_set_kv_layers``, the only places that know how a
``DynamicCache`` stores its tensors (``cache.layers[i].keys`` in transformers 5, ``key_cache[i]`` in 4.x).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from orchard.engines.prefix_cache import KV, PrefixCache, PrefixHit

WIDTH_SLACK = 32
"""Columns a prefill that reuses cached prefixes may add beyond its longest prompt."""


class KVBatch:
    """Running sequences of one model: their KV cache, attention mask and next positions."""

    def __init__(self, model: PreTrainedModel, pad_token_id: int, prefix_cache_bytes: int = 0) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.prefilled_tokens = 0  # prompt tokens run through the model
        self.reused_tokens = 0  # prompt tokens whose keys and values came from the prefix cache
        parameters = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in parameters else "past_key_values"  # renamed in transformers 5.x
        self._last_only = {k: 1 for k in ("logits_to_keep", "num_logits_to_keep") if k in parameters}
        self._device = next(model.parameters()).device
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self._device)
        self._positions = torch.zeros(0, dtype=torch.long, device=self._device)

    @property
    def size(self) -> int:
        """Number of sequences in the batch."""
        return int(self._positions.shape[0])

    @property
    def width(self) -> int:
        """Columns of the cache: the longest padded sequence."""
        return int(self._mask.shape[1])

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Append ``prompts`` as new rows (after the existing ones); return their next-token logits (k, V).

        A prompt that shares a prefix with a remembered sequence (``remember``) runs only from where it differs."""
        hits = [self.prefix_cache.lookup(prompt) for prompt in prompts]
        if any(hit is not None for hit in hits):
            reused = [hit.length if hit is not None else 0 for hit in hits]
            width = max(reused) + max(len(prompt) - done for prompt, done in zip(prompts, reused, strict=True))
            # Reused prefixes and remainders are aligned separately: a long reuse beside a long remainder would
            # widen the batch past any prompt (and every row with it, for as long as they run). Then prefill all.
            if width <= max(len(prompt) for prompt in prompts) + WIDTH_SLACK:
                return self._prefill_after(prompts, hits)
        self.prefilled_tokens += sum(len(p) for p in prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = _new_cache(self.model)
        out = self._forward(ids, mask, positions, cache, **self._last_only)
        self._merge(cache, mask, torch.tensor([len(p) for p in prompts], device=self._device))
        return out.logits[:, -1, :].float()

    @torch.inference_mode()
    def decode(self, tokens: list[int]) -> torch.Tensor:
        """Feed one token per row (in row order); return the next-token logits (B, V)."""
        ids = torch.tensor(tokens, dtype=torch.long, device=self._device).unsqueeze(1)
        ones = torch.ones((self.size, 1), dtype=torch.long, device=self._device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        out = self._forward(ids, self._mask, self._positions.unsqueeze(1), self._cache)
        self._positions = self._positions + 1
        return out.logits[:, -1, :].float()

    @torch.inference_mode()
    def remember(self, row: int, fed_tokens: list[int]) -> None:
        """Offer row ``row``'s keys and values, the ones of ``fed_tokens`` (its prompt and the answer tokens fed
        back), to the prefix cache; call it before ``keep`` drops the row."""
        if self.prefix_cache.max_bytes <= 0 or self._cache is None:
            return
        columns = torch.nonzero(self._mask[row]).squeeze(1)
        if len(columns) != len(fed_tokens):  # not what this row holds: keep nothing rather than something wrong
            return
        layers = [
            (k[row : row + 1, :, columns].clone(), v[row : row + 1, :, columns].clone())
            for k, v in _kv_layers(self._cache)
        ]
        self.prefix_cache.remember(fed_tokens, layers)

    def _prefill_after(self, prompts: list[list[int]], hits: list[PrefixHit | None]) -> torch.Tensor:
        """Prefill each prompt from the end of its cached prefix: the prefixes' keys and values, right-aligned and
        left-padded to a common width, form the starting cache; the remainders, left-padded, run in one pass with
        their real positions. The padding between a short remainder and its prefix is masked like any other."""
        lengths = [hit.length if hit is not None else 0 for hit in hits]
        width = max(lengths)
        sample = next(hit for hit in hits if hit is not None).layers
        layers: list[KV] = []
        for index, (shape_of, _) in enumerate(sample):
            empty = shape_of.new_zeros((1, shape_of.shape[1], 0, shape_of.shape[3]))
            padded = [_left_pad_kv(*(hit.layers[index] if hit is not None else (empty, empty)), width) for hit in hits]
            layers.append((torch.cat([k for k, _ in padded]), torch.cat([v for _, v in padded])))
        rests = [prompt[length:] for prompt, length in zip(prompts, lengths, strict=True)]
        rest_width = max(len(rest) for rest in rests)
        ids = torch.full((len(prompts), rest_width), self.pad_token_id, dtype=torch.long)
        prefix_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        rest_mask = torch.zeros((len(prompts), rest_width), dtype=torch.long)
        for row, (rest, length) in enumerate(zip(rests, lengths, strict=True)):
            ids[row, rest_width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            rest_mask[row, rest_width - len(rest) :] = 1
            prefix_mask[row, width - length :] = 1
        done = torch.tensor(lengths, dtype=torch.long).unsqueeze(1)
        positions = (done + rest_mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([prefix_mask, rest_mask], dim=1)
        ids, mask, positions = ids.to(self._device), mask.to(self._device), positions.to(self._device)
        cache = _new_cache(self.model)
        for index, (keys, values) in enumerate(layers):
            cache.update(keys.to(self._device), values.to(self._device), index)
        out = self._forward(ids, mask, positions, cache, **self._last_only)
        self._merge(cache, mask, torch.tensor([len(p) for p in prompts], device=self._device))
        self.prefilled_tokens += sum(len(rest) for rest in rests)
        self.reused_tokens += sum(lengths)
        return out.logits[:, -1, :].float()

    @torch.inference_mode()
    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); drop the others and the padding no remaining row needs."""
        if len(rows) == self.size:
            return
        if not rows:
            self._cache = None
            self._mask = self._mask[:0, :0]
            self._positions = self._positions[:0]
            return
        index = torch.tensor(rows, dtype=torch.long, device=self._device)
        self._mask = self._mask[index]
        self._positions = self._positions[index]
        layers = [(k[index], v[index]) for k, v in _kv_layers(self._cache)]
        lead = int(torch.nonzero(self._mask.any(dim=0))[0, 0])  # padding columns shared by every row
        if lead:
            self._mask = self._mask[:, lead:]
            layers = [(k[:, :, lead:], v[:, :, lead:]) for k, v in layers]
        _set_kv_layers(self._cache, layers)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any, **kw: Any) -> Any:
        kwargs = {self._cache_kwarg: cache, **kw}
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs)

    def _merge(self, cache: DynamicCache, mask: torch.Tensor, lengths: torch.Tensor) -> None:
        if self._cache is None or self.size == 0:
            self._cache, self._mask, self._positions = cache, mask, lengths
            return
        width = max(self.width, mask.shape[1])
        old = [_left_pad_kv(k, v, width) for k, v in _kv_layers(self._cache)]
        new = [_left_pad_kv(k, v, width) for k, v in _kv_layers(cache)]
        joined = [(torch.cat([ok, nk]), torch.cat([ov, nv])) for (ok, ov), (nk, nv) in zip(old, new, strict=True)]
        _set_kv_layers(self._cache, joined)
        self._mask = torch.cat([_left_pad(self._mask, width), _left_pad(mask, width)])
        self._positions = torch.cat([self._positions, lengths])


def _left_pad(mask: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(mask, (width - mask.shape[1], 0))


def _left_pad_kv(keys: torch.Tensor, values: torch.Tensor, width: int) -> KV:
    extra = width - keys.shape[2]
    if extra == 0:
        return keys, values
    pad = (0, 0, extra, 0)  # (head_dim: none, sequence: left)
    return torch.nn.functional.pad(keys, pad), torch.nn.functional.pad(values, pad)


def _new_cache(model: PreTrainedModel) -> DynamicCache:
    if "config" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(config=model.config)
    return DynamicCache()


def _kv_layers(cache: Any) -> list[KV]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def _set_kv_layers(cache: Any, layers: list[KV]) -> None:
    if hasattr(cache, "layers"):
        for layer, (keys, values) in zip(cache.layers, layers, strict=True):
            layer.keys, layer.values = keys, values
        return
    cache.key_cache[:] = [k for k, _ in layers]
    cache.value_cache[:] = [v for _, v in layers]
