"""Orchard-GUI: web apps served inside the episode's sandbox, a headless-Chromium browser harness, a task suite with
state-checking graders, image references for the proxy, and loaders of public web-agent task files."""
