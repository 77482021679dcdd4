"""Orchard recipes: task families with their graders, expert demonstrations and staged training pipelines."""
