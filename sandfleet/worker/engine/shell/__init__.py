"""Shell mode's sandbox side: one session sandbox per job and the five tools that drive it.

``SessionKeeper`` (keeper.py) makes, watches and destroys session sandboxes; ``SessionSandbox``
(session.py) is one of them; ``ShellTools`` (tools.py) are ``sandbox_exec``, ``sandbox_read_file``,
``sandbox_write_file``, ``sandbox_list_files`` and ``sandbox_install_package`` as ordinary tools of a
registry, so the tool-calling loop offers them like any other. File paths are resolved inside the
container by files_helper.py; output is cut to head and tail by ``sandfleet.worker.engine.clip``.
"""
