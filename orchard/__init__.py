"""Orchard: train LLM agents with reinforcement learning inside the harness they are deployed in."""

__version__ = "0.1.0"
