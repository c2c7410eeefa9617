"""Human approval of bridged calls on the worker side: the policy, the gate the bridge asks, the
suspension checkpoint and the webhook. Requests themselves live in sandfleet/core/approvals.py."""
