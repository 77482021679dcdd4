"""The ``local`` runtime (``runtime.LocalRuntime``): each sandbox a working copy and isolated process trees on this
machine, and the helpers that isolate, limit and provision it."""
