"""The viewer's HTTP face: one HTML page (vanilla JS and CSS from ``static/``, nothing fetched from elsewhere) and
a JSON API under ``/api``.

=========================================  =====================================================================
``GET /``                                  the page
``GET /api/run``                           run ids, stages (with episode counts), the values each filter takes
``GET /api/episodes?task=&status=...``     the filtered episode list, newest first (``limit``, ``offset``)
``GET /api/episodes/{id}``                 one episode turn by turn
``GET /api/episodes/{id}/artifacts/{n}``   the ``n``-th artifact of its outcome, from the run's store
``GET /api/curves?window=16``              per-stage training curves, held-out rows, trainer loss
=========================================  =====================================================================

A client's mistake is a 4xx with a ``detail`` message: an unknown episode 404, a filter value that cannot match
422 (FastAPI's own validation answers 422 for a value of the wrong type).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from orchard.viewer.exceptions import BadQueryError, NotFoundError, ViewerError
from orchard.viewer.filters import EpisodeFilter, Kind
from orchard.viewer.run_view import RunView

STATIC = Path(__file__).parent / "static"
ERROR_STATUS: tuple[tuple[type[ViewerError], int], ...] = ((NotFoundError, 404), (BadQueryError, 422))


def create_app(view: RunView) -> FastAPI:
    """The viewer app over ``view``; the view's bus and store are closed when the app shuts down."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            view.close()

    app = FastAPI(title="Orchard trajectory viewer", lifespan=lifespan, docs_url="/api/docs", redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_exception_handler(ViewerError, _viewer_error)  # type: ignore[arg-type]
    _routes(app, view)
    return app


def _routes(app: FastAPI, view: RunView) -> None:
    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/api/run", response_model=None)
    def run() -> dict[str, object]:
        return view.run()

    @app.get("/api/episodes", response_model=None)
    def episodes(
        run: str | None = None,
        task: str | None = None,
        status: str | None = None,
        stage: str | None = None,
        policy_version: int | None = None,
        reward_min: float | None = None,
        reward_max: float | None = None,
        kind: Kind = "all",
        limit: int = Query(200, ge=1, le=5000),
        offset: int = Query(0, ge=0),
    ) -> dict[str, object]:
        selection = EpisodeFilter(run or None, task or None, status or None, stage or None, policy_version,
                                  reward_min, reward_max, kind)  # fmt: skip
        return view.episodes(selection, limit=limit, offset=offset)

    @app.get("/api/episodes/{episode_id}", response_model=None)
    def episode(episode_id: str) -> dict[str, object]:
        return view.episode(episode_id)

    @app.get("/api/episodes/{episode_id}/artifacts/{number}")
    def artifact(episode_id: str, number: int) -> Response:
        uri, content = view.artifact(episode_id, number)
        return Response(content, media_type="text/plain; charset=utf-8", headers={"X-Artifact-Uri": uri})

    @app.get("/api/curves", response_model=None)
    def curves(window: int = Query(16, ge=1, le=10_000)) -> dict[str, object]:
        return view.curves(window)


async def _viewer_error(_: Request, exc: ViewerError) -> JSONResponse:
    status = next((code for kind, code in ERROR_STATUS if isinstance(exc, kind)), 400)
    return JSONResponse({"detail": str(exc)}, status_code=status)
