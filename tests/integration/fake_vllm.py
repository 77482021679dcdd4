"""A stand-in for ``vllm serve`` (same command line, same HTTP endpoints), for testing the vLLM backend without a GPU.

Run as ``python fake_vllm.py serve MODEL --port P --served-model-name NAME [other vllm flags]``. It answers chat
completions with the recorded vLLM answers of ``tests/unit/engines/vllm_fixtures.py``; ``/collective_rpc`` and
``/reset_prefix_cache`` exist only with ``VLLM_SERVER_DEV_MODE=1``, as in vLLM. ``orchard_load_weights`` checks that
the directory it is given holds safetensors files and counts the loads; ``GET /fake/log`` returns every call.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

_spec = importlib.util.spec_from_file_location(
    "vllm_fixtures", Path(__file__).parents[1] / "unit" / "engines" / "vllm_fixtures.py"
)
assert _spec is not None and _spec.loader is not None
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)


def build_app(served: str, argv: list[str]) -> FastAPI:
    """The fake server's app."""
    app = FastAPI()
    log: list[dict[str, Any]] = [{"argv": argv}]
    loads: list[str] = []

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served, "object": "model", "max_model_len": 2048}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        log.append({"chat": body})
        if body.get("model") != served:
            error = {
                "message": f"The model `{body.get('model')}` does not exist.",
                "type": "NotFoundError",
                "code": 404,
            }
            return JSONResponse({"error": error}, 404)
        if body["stream"]:
            frames = [f"data: {json.dumps(c)}\n\n" for c in fx.hello_stream()] + ["data: [DONE]\n\n"]
            return StreamingResponse(iter(frames), media_type="text/event-stream")
        return JSONResponse(fx.hello_response(body["n"]))

    @app.get("/fake/log")
    async def fake_log() -> list[dict[str, Any]]:
        return log

    if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request) -> Response:
            body = await request.json()
            log.append({"rpc": body})
            if body["method"] == "orchard_load_weights":
                files = sorted(Path(body["args"][0]).glob("*.safetensors"))
                if not files:
                    return JSONResponse({"detail": "no safetensors"}, 500)
                loads.append(body["args"][0])
                return JSONResponse({"results": [{"files": len(files), "tensors": 2}]})
            if body["method"] == "orchard_weights_digest":
                return JSONResponse({"results": [{"parameters": 2, "sum": float(len(loads))}]})
            return JSONResponse({"detail": f"no method {body['method']}"}, 500)

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> Response:
            log.append({"reset": True})
            return Response(status_code=200)

    return app


def main() -> None:
    """Parse ``vllm serve``'s arguments (ignoring the ones a fake has no use for) and serve."""
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", default=None)
    args, _ = parser.parse_known_args()
    served = args.served_model_name or args.model
    uvicorn.run(build_app(served, sys.argv[1:]), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
