"""The labels on every Sandfleet container: its role, and its owner (a process), so that a reaper
can tell the leftovers of dead processes from the containers of live ones."""

LABEL_ROLE = "sandfleet.role"
LABEL_OWNER = "sandfleet.owner"
LABEL_CONFIG = "sandfleet.config"
LABEL_JOB = "sandfleet.job"
LABEL_PERSISTENT = "sandfleet.persistent"
LABEL_EXPIRES = (
    "sandfleet.expires"  # epoch seconds; past it the reaper removes the container, owner alive or not
)
ROLE_SESSION = "session"  # LABEL_ROLE of a shell job's session sandbox (pool sandboxes: "sandbox")
