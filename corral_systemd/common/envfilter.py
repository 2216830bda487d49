"""--env-clear / --env-keep / --env-drop: what environment the command gets.

Rules, in order: start from corral's environment; with ``--env-clear``
keep only the names matching a ``--env-keep`` glob; then remove the names
matching a ``--env-drop`` glob (drop wins over keep). Globs are fnmatch
patterns matched case-sensitively. Only names are ever reported.

corral itself adds one variable, and only with ``--credential``:
``CREDENTIALS_DIRECTORY``. In service mode systemd adds ``MANAGERPID`` (a user manager) and
``SYSTEMD_EXEC_PID`` to every service; corral removes every other variable
the manager would add (``UnsetEnvironment=``) when the environment is
filtered.
"""

from fnmatch import fnmatchcase


def _matches(name: str, patterns) -> bool:
    return any(fnmatchcase(name, p) for p in patterns)


def filter_environment(environ, *, clear: bool, keep=(), drop=()) -> tuple[dict | None, dict | None]:
    """(env for the command or None = corral's own, names report or None)."""
    keep, drop = list(keep), list(drop)
    if not clear and not keep and not drop:
        return None, None
    env = {}
    for name, value in environ.items():
        if clear and not _matches(name, keep):
            continue
        if _matches(name, drop):
            continue
        env[name] = value
    report = {
        "cleared": clear,
        "keep": keep,
        "drop": drop,
        "kept": sorted(env),
        "dropped": sorted(set(environ) - set(env)),
    }
    return env, report
