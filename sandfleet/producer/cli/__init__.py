"""The producer's commands: submit, batch, result, audit, jobs."""
