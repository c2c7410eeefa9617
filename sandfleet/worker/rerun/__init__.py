"""Re-running finished jobs from their audit chains: one job, or a batch at once."""
