"""The engine: turns a JobSpec into a JobResult in the job's mode (modes.py).

Every mode admits its job first (admission.py). code-action: code_action.py (``CodeActionRun``);
shell: shell/mode.py (session sandbox, shell/keeper.py); chat: chat.py. Shell and chat share the
tool-calling loop (toolloop.py), its functions (functions.py, schemas.py) and records (outcome.py).
"""

from sandfleet.core.audit_sink import AuditSink, ListAudit, NullAudit
from sandfleet.worker.engine.modes import run_job
from sandfleet.worker.engine.services import EngineOptions, EngineServices

__all__ = ["AuditSink", "EngineOptions", "EngineServices", "ListAudit", "NullAudit", "run_job"]
