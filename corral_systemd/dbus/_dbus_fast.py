"""The parts of dbus-fast this client uses, imported the cheap way if allowed.

``dbus_fast/__init__.py`` imports its asyncio message bus, service and
introspection layers. We need only Message, MessageType, Variant and the
Unmarshaller. When ``corral_systemd.dbus.light_import`` is set (the CLI)
and nobody has imported dbus_fast yet, the package is registered without
running its __init__, and the submodules load on their own — they do not
depend on the package namespace. In any other case the normal import runs.
"""

import sys

from . import light_import

if light_import and "dbus_fast" not in sys.modules:
    import importlib.util
    import types

    _spec = importlib.util.find_spec("dbus_fast")
    assert _spec is not None and _spec.submodule_search_locations is not None, "dbus-fast is not installed"
    _pkg = types.ModuleType("dbus_fast")
    _pkg.__spec__ = _spec
    _pkg.__path__ = list(_spec.submodule_search_locations)
    _pkg.__file__ = _spec.origin
    sys.modules["dbus_fast"] = _pkg

# Order matters: message first, as dbus_fast's own __init__ does (the
# unmarshaller and signature modules import each other through it).
from dbus_fast.message import Message  # noqa: E402, I001
from dbus_fast.constants import MessageFlag, MessageType  # noqa: E402
from dbus_fast.signature import Variant  # noqa: E402
from dbus_fast._private.unmarshaller import Unmarshaller  # noqa: E402

__all__ = ["Message", "MessageFlag", "MessageType", "Unmarshaller", "Variant"]
