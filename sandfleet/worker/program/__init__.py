"""Running one program: the runtime, the host side of the tool bridge, artifacts."""
