"""The model side of the fleet: the client that calls a model, and the replay server that plays one.

``sandfleet.worker.llm.client`` is the only module that imports ``openai``; the replay modules use the standard
library, so the server runs anywhere the fleet does. Import the parts you need from their modules.
"""
