"""A small synchronous D-Bus client over dbus-fast's message marshalling.

corral's supervisor is a synchronous poll loop (so the fallback path never
loads asyncio); this client fits into it: a blocking connect and call with
timeouts, and a non-blocking ``read_pending()`` for when the socket polls
readable. Signals that arrive while waiting for a reply are queued, never
lost.
"""
