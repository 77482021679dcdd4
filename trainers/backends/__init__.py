"""The trainer backend seam: the interface (``base.TrainingBackend``), the backends behind it (``torch_backend``,
``deepspeed_backend``) and the factory that picks one from the trainer's ``backend`` config (``factory.open_backend``;
the config union is ``trainers.config.TrainerBackendConfig``, keyed by ``type``). The interface is re-exported here;
the backends and the factory are imported from their own modules, so importing the interface loads no backend."""

from trainers.backends.base import TrainingBackend

__all__ = ["TrainingBackend"]
