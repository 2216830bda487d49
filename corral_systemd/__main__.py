from .client import entry

entry()
