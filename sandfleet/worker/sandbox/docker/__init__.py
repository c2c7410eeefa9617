"""The Docker backend: the engine client, container specs, attach, the reaper, labels."""
