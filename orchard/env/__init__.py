"""Orchard Env: isolated sandboxes for episodes (the runtimes of ``orchard.sandbox``), and the episode service."""
