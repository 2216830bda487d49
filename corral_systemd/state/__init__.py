"""What outlives one corral process: the registry of runs (entries, sealed
owner tokens, the hash-chained audit log, retention), corral's own
credentials directories, and the journal copy of the audit events.

Imports only ``common`` and ``kernel``; the command's uid can write all of
it, so the readers (``corralctl``) cross-check it against the kernel.
"""
