"""The scripted model: an OpenAI-compatible server replaying a script (``replay:FILE`` models)."""
