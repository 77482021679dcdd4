"""Policy and value trainers that pull samples from the bus and publish weights to the store."""
