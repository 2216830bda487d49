"""A small synchronous D-Bus client over dbus-fast's message marshalling.

corral's supervisor is a synchronous poll loop (so the fallback path never
loads asyncio); this client fits into it: a blocking connect and call with
timeouts, and a non-blocking ``read_pending()`` for when the socket polls
readable. Signals that arrive while waiting for a reply are queued, never
lost.
"""

#: Set by the CLI, which owns its process: load only dbus-fast's message
#: and marshalling modules, skipping the package __init__ (asyncio, XML
#: introspection: ~40 ms of every corral start). Library users get the
#: normal, complete import.
light_import = False
