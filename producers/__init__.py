"""What runs beside episodes and publishes records: model calls, outcomes, sandbox events."""
