"""Orchard Env, the episode service (``orchard env serve``): tasks and graders, the runner, the scheduler and the HTTP
service. Its sandboxes come from ``orchard.sandbox``."""
