"""Tools that drive both sides at once: local fleets (Redis, workers, a replay model), the load
test and the demo. The only room that imports both the producer and the worker."""
