"""The run, independent of how it is enforced: the spec (what is asked and
its validation), the supervisor (deadline, limits, signals, output), the stop
sequence, the result and its exit code, the record, and the assembly of a run
that the faces above (``cli``, ``api``, and ``fallback_child`` here) share.

Imports ``state`` (the registry around a run), ``engines`` (which run it) and
``common``; nothing here prints except through the faces.
"""
