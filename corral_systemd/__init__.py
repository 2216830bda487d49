"""corral-systemd: run a command under limits; when it returns, everything
the command started is gone — proven, or exit 120.

This module stays import-light: the CLI imports it on every run.
"""

__version__ = "0.1.0"
