"""What every layer may read: the declarations (``limits``: each limit once;
``unitprops``: the unit properties ``-p`` may pass), error types, units of
measure, argv redaction, environment filtering, and the Runner's baton.

Imports nothing else of corral's.
"""
