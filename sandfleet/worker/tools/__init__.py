"""Tools: host-side Python functions that a sandboxed program calls through the bridge.

``ToolRegistry`` loads and narrows them, ``Tool`` describes and checks one, ``to_json_value`` decides
what may cross back to the program.
"""

from sandfleet.worker.tools.registry import Tool, ToolRegistry, ToolWarning, side_effects
from sandfleet.worker.tools.values import ValueConversionError, json_size, to_json_value

__all__ = [
    "Tool",
    "ToolRegistry",
    "ToolWarning",
    "ValueConversionError",
    "json_size",
    "side_effects",
    "to_json_value",
]
