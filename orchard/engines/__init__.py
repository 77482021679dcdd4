"""Inference engines Orchard talks to through the OpenAI API, and the token-trace contract they share."""
