"""The vLLM worker extension that loads a new policy version's weights from a directory, inside vLLM's workers.

vLLM mixes a class named by ``--worker-extension-cls`` into each GPU worker, and its methods can then be called on
every worker with ``collective_rpc`` (over HTTP: ``POST /collective_rpc {"method", "args"}``, served when the
server runs with ``VLLM_SERVER_DEV_MODE=1``). Orchard launches vLLM with::

    --worker-extension-cls orchard.engines.vllm_worker.OrchardWorkerExtension

and the shim calls ``orchard_load_weights(directory)`` once the version's files are downloaded and verified
(sha256, tensor names and shapes) and no request is in flight. Each worker reads every safetensors header first (a
corrupt file fails before any weight changes), then streams the tensors into ``model.load_weights``, vLLM's own
loader, which maps Hugging Face names onto its fused layers and shards them for tensor parallelism — the same
mechanism as vLLM's RLHF examples (``examples/offline_inference/rlhf_utils.py``), reading from disk instead of
an NCCL broadcast.

This module imports neither vLLM nor torch at import time: the shim and the tests import it without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchard.engines.weights_signature import read_header, safetensors_files

WORKER_EXTENSION = "orchard.engines.vllm_worker.OrchardWorkerExtension"
LOAD_METHOD = "orchard_load_weights"
DIGEST_METHOD = "orchard_weights_digest"


def iter_tensors(files: list[Path], device: str) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of every tensor of ``files``, one file open at a time."""
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="pt", device=device) as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


class OrchardWorkerExtension:
    """Methods mixed into each vLLM GPU worker (``self`` is the worker: ``self.model_runner``, ``self.device``)."""

    model_runner: Any
    device: Any

    def orchard_load_weights(self, directory: str) -> dict[str, Any]:
        """Load every tensor of ``directory``'s safetensors files into the served model; return counts."""
        import torch

        files = safetensors_files(Path(directory))
        expected = sum(len([k for k in read_header(f) if k != "__metadata__"]) for f in files)
        counted = 0

        def counting() -> Iterator[tuple[str, Any]]:
            nonlocal counted
            for item in iter_tensors(files, "cpu"):
                counted += 1
                yield item

        self.model_runner.model.load_weights(weights=counting())
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if counted != expected:
            raise RuntimeError(f"load_weights consumed {counted} of the {expected} tensors in {directory}")
        return {"files": len(files), "tensors": counted}

    def orchard_weights_digest(self) -> dict[str, Any]:
        """A cheap fingerprint of the served weights (parameter count and a float sum) to see that a swap took."""
        import torch

        total, count = 0.0, 0
        with torch.no_grad():
            for _, param in self.model_runner.model.named_parameters():
                total += float(param.float().sum().item())
                count += 1
        return {"parameters": count, "sum": total}
