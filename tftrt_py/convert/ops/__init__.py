"""Op converters, one module per op family; importing this package registers them all."""
from tftrt_py.convert.ops.registry import find_converter, get_converter, register, registered_ops

from tftrt_py.convert.ops import activation, elementwise, identity  # noqa: F401,E402  (registration)

__all__ = ["register", "get_converter", "find_converter", "registered_ops"]
