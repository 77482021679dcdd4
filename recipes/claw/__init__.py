"""Orchard-Claw: a personal-assistant recipe over stateful local services (calendar, mail, contacts, tasks, files)."""
