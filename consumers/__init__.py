"""Stream processors over the bus and the reward plug-in API."""
