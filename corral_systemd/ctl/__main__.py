"""``python -m corral_systemd.ctl``: the same as ``corralctl``."""

from .app import entry

entry()
