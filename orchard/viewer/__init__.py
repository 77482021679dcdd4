"""The trajectory viewer (``orchard view RUN_DIR``): a run's episodes, turn by turn and token by token, and its
curves, served from its bus, store and run directory. See ``README.md``."""

from orchard.viewer.app import create_app
from orchard.viewer.exceptions import BadQueryError, NotFoundError, ViewerError
from orchard.viewer.run_view import RunView

__all__ = ["BadQueryError", "NotFoundError", "RunView", "ViewerError", "create_app"]
