"""The recording proxy's HTTP app: OpenAI- and Anthropic-compatible routes for harnesses, admin routes for the Env.

Harness routes (the episode token as ``Authorization: Bearer <token>`` or ``x-api-key: <token>``):
``POST /v1/chat/completions``, ``POST /v1/responses``, ``POST /v1/messages`` (Anthropic Messages, ``?beta=true``
accepted like any query), ``POST /v1/messages/count_tokens`` (counted by the backend's ``/tokenize``, not recorded),
``GET /v1/models``. Admin routes (``Authorization: Bearer <admin token>``): ``POST /admin/episodes`` (register an
episode, get its token), ``GET /admin/episodes/{id}``, ``DELETE /admin/episodes/{id}`` (revoke and confirm every
call on the bus). ``GET /healthz`` needs no token. Errors are Anthropic error objects on the ``/v1/messages``
routes (``messages_reply``), OpenAI error objects everywhere else (``exceptions.py``).

Checks happen in this order, and a request failing one is never forwarded nor recorded: token (401), body size
(413), JSON and required fields (400).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from orchard.bus import Bus
from orchard.clock import now_ms
from orchard.logging import get_logger
from orchard.store import ArtifactStore
from producers.proxy.backend import BackendClient
from producers.proxy.bus_writer import BusWriter
from producers.proxy.episodes import EpisodeGrant, EpisodeRegistry, EpisodeSpec, EpisodeSummary
from producers.proxy.exceptions import (
    AuthenticationError,
    BackendError,
    BackendRejectedError,
    BadRequestError,
    NotFoundError,
    ProxyError,
    RequestTooLargeError,
)
from producers.proxy.forward import CallForwarder
from producers.proxy.images import ImageRecorder
from producers.proxy.messages import count_tokens_body, parse_messages_request
from producers.proxy.messages_reply import anthropic_error
from producers.proxy.request import ApiFlavour, parse_request
from producers.proxy.settings import ProxySettings

log = get_logger("proxy.app")

REAP_INTERVAL_S = 10.0


class RecordingProxy:
    """The proxy's parts (bus writer, episodes, backend client, forwarder), started and stopped with the app."""

    def __init__(self, settings: ProxySettings, bus: Bus, image_store: ArtifactStore | None = None) -> None:
        """Create the parts; nothing runs until ``lifespan`` starts. With ``image_store``, inline images of recorded
        calls go there (by digest) instead of onto the bus."""
        self.settings, self.bus = settings, bus
        self.writer = BusWriter(
            bus.producer(), flush_interval_s=settings.flush_interval_s, flush_timeout_s=settings.flush_timeout_s
        )
        self.images = ImageRecorder(image_store) if image_store is not None else None
        self.episodes = EpisodeRegistry(settings, self.writer, images=self.images)
        self.backend = BackendClient(settings)
        self.forwarder = CallForwarder(self.backend)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Run background flushes and reaping; at shutdown close every episode, then the backend and the bus.

        Startup fails (``TopicNotFoundError``) when the ModelCall topic does not exist: create it first
        (``orchard topics create``), so no call is answered that cannot be recorded.
        """
        await asyncio.to_thread(self.bus.describe_topic, self.settings.model_calls_topic)
        await asyncio.to_thread(self.writer.target.record_limit, self.settings.model_calls_topic)  # cached from now
        self.writer.start()
        reaper = asyncio.create_task(self._reap_periodically(), name="orchard-proxy-reaper")
        log.info("recording proxy started", backend=self.settings.backend_base_url, run_id=self.settings.run_id)
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await self.episodes.close_all()
            await self.backend.aclose()
            await self.writer.close()
            log.info("recording proxy stopped")

    async def _reap_periodically(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            await self.episodes.reap()

    async def model_call(self, request: Request, flavour: ApiFlavour) -> Response:
        """Authenticate, read and check, forward, record."""
        started, received_ms = time.perf_counter(), now_ms()
        session = self.episodes.authenticate(api_key(request))
        raw = await read_body(request, self.settings.max_request_bytes)
        parsed = parse_messages_request(raw) if flavour == "MESSAGES" else parse_request(raw, flavour)
        parsed = session.canonicalize(parsed)
        return await self.forwarder.forward(session, parsed, started, received_ms, lambda: hung_up(request.receive))

    async def count_tokens(self, request: Request) -> Response:
        """``/v1/messages/count_tokens``: the prompt's tokens as the backend renders it (nothing is recorded)."""
        session = self.episodes.authenticate(api_key(request))
        chat = count_tokens_body(await read_body(request, self.settings.max_request_bytes))
        try:
            answer = await self.backend.post("/tokenize", chat, session.spec.episode_id)
        except BackendRejectedError as exc:
            if exc.status != 404:
                raise
            raise NotFoundError("the backend cannot count tokens: it serves no /tokenize") from exc
        count = answer.get("count")
        if not isinstance(count, int) or isinstance(count, bool):
            raise BackendError("the backend's /tokenize answer has no token count")
        return JSONResponse({"input_tokens": count})

    def require_admin(self, request: Request) -> None:
        """Refuse a request without the admin token."""
        token = bearer_token(request) or ""
        if not hmac.compare_digest(token.encode(), self.settings.admin_token.get_secret_value().encode()):
            raise AuthenticationError("admin routes need the proxy's admin token", code="invalid_admin_token")


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def api_key(request: Request) -> str | None:
    """A harness's key: the Bearer token, else the ``x-api-key`` header (Anthropic clients send that)."""
    return bearer_token(request) or request.headers.get("x-api-key", "").strip() or None


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequestError("invalid Content-Length header")
        if int(declared) > limit:
            raise RequestTooLargeError(f"request body of {declared} bytes is over the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestTooLargeError(f"request body is over the limit of {limit} bytes")
    return bytes(body)


async def hung_up(receive: Receive) -> None:
    """Return once the harness has closed its connection (call it after the request's body has been read: the ASGI
    server then sends nothing more until the client disconnects)."""
    while (await receive())["type"] != "http.disconnect":
        pass


MODEL_CALL_ROUTES: dict[str, ApiFlavour] = {
    "/v1/chat/completions": "CHAT",
    "/v1/responses": "RESPONSES",
    "/v1/messages": "MESSAGES",
}
COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"
Handler = Callable[[Request], Awaitable[Response]]


class ModelCallShortcut:
    """ASGI middleware serving ``POST`` of the model-call routes (and ``count_tokens``) straight from the proxy,
    past FastAPI's routing, exception and dependency layers (about 0.1 ms of every call); any other request goes on
    to the app. A ``ProxyError`` becomes its error object exactly as the app's handler makes it, or Anthropic's on
    the ``/v1/messages`` routes."""

    def __init__(self, app: ASGIApp, proxy: RecordingProxy) -> None:
        """Wrap ``app``; model calls go to ``proxy``."""
        self.app, self.proxy = app, proxy

    def _handler(self, scope: Scope) -> Handler | None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = scope["path"]
        if path == COUNT_TOKENS_ROUTE:
            return self.proxy.count_tokens
        flavour = MODEL_CALL_ROUTES.get(path)
        if flavour is None:
            return None
        return lambda request: self.proxy.model_call(request, flavour)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a model call, or pass the request on."""
        handler = self._handler(scope)
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(Request(scope, receive))
        except ProxyError as exc:
            response = error_response(exc, anthropic=scope["path"].startswith("/v1/messages"))
        await response(scope, receive, send)


def error_response(exc: ProxyError, *, anthropic: bool = False) -> JSONResponse:
    """The error answer of ``exc``: an OpenAI error object, or Anthropic's."""
    return JSONResponse(anthropic_error(exc) if anthropic else exc.payload(), exc.status)


def _model_routes(proxy: RecordingProxy) -> APIRouter:
    router = APIRouter()

    # POSTs of these are served by ModelCallShortcut before routing; the routes remain for other methods (405)
    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy.model_call(request, "CHAT")

    @router.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await proxy.model_call(request, "RESPONSES")

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await proxy.model_call(request, "MESSAGES")

    @router.post(COUNT_TOKENS_ROUTE)
    async def count_tokens(request: Request) -> Response:
        return await proxy.count_tokens(request)

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        proxy.episodes.authenticate(api_key(request))
        status, body = await proxy.backend.get("/models")
        return Response(body, status, media_type="application/json")

    @router.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "episodes": proxy.episodes.active}

    return router


def _admin_routes(proxy: RecordingProxy) -> APIRouter:
    router = APIRouter(prefix="/admin", dependencies=[Depends(proxy.require_admin)])

    @router.post("/episodes", status_code=201)
    async def open_episode(spec: EpisodeSpec) -> EpisodeGrant:
        return proxy.episodes.open(spec)

    @router.get("/episodes/{episode_id}")
    async def episode(episode_id: str) -> EpisodeSummary:
        return proxy.episodes.summary(episode_id)

    @router.delete("/episodes/{episode_id}")
    async def close_episode(episode_id: str) -> EpisodeSummary:
        return await proxy.episodes.close(episode_id)

    return router


def _install_error_handlers(app: FastAPI) -> None:
    async def proxy_error(request: Request, exc: Exception) -> Response:
        error = exc if isinstance(exc, ProxyError) else ProxyError(str(exc))
        return JSONResponse(error.payload(), error.status)

    async def invalid_body(request: Request, exc: Exception) -> Response:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
        return await proxy_error(request, BadRequestError(f"invalid request body: {detail}"))

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
        message = f"{request.method} {request.url.path}: {getattr(exc, 'detail', exc)}"
        error = ProxyError(message, code="not_found" if status == 404 else "http_error")
        error.status, error.error_type = status, "invalid_request_error" if status < 500 else "server_error"
        return await proxy_error(request, error)

    app.add_exception_handler(ProxyError, proxy_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(StarletteHTTPException, http_error)


def create_proxy_app(settings: ProxySettings, bus: Bus, image_store: ArtifactStore | None = None) -> FastAPI:
    """The recording proxy as a FastAPI app publishing ModelCalls to ``bus`` (which the caller owns and closes);
    inline images of the calls go to ``image_store`` by digest when one is given (``producers.proxy.images``)."""
    proxy = RecordingProxy(settings, bus, image_store)
    app = FastAPI(
        title="Orchard recording proxy", lifespan=proxy.lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.proxy = proxy
    _install_error_handlers(app)
    app.include_router(_model_routes(proxy))
    app.include_router(_admin_routes(proxy))
    app.add_middleware(ModelCallShortcut, proxy=proxy)
    return app
