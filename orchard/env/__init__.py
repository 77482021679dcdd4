"""Orchard Env: isolated sandboxes for episodes, their runtimes, and the episode service."""
