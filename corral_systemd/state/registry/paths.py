"""Where the registry lives: the state directory, private directories, run ids."""

import os

from ...common import unit_names

# -- where ------------------------------------------------------------
#: The private fallback for a user without a runtime directory (cron, ``su -c``), below $HOME.
STATE_FALLBACK = os.path.join(".local", "state", "corral")


def state_dir(env=os.environ) -> str:
    """Where the registry lives (see the module docstring and ``man corralctl``).

    A user without ``$XDG_RUNTIME_DIR`` (cron, ``su -c``) gets
    ``/run/user/UID/corral`` if that runtime directory exists and is theirs
    and private, else ``$XDG_STATE_HOME/corral`` (``~/.local/state/corral``):
    a path no other user can create first, found again by corralctl from
    the same environment. ``/tmp/corral-UID`` would be squattable.
    """
    override = env.get("CORRAL_STATE_DIR")
    if override:
        return os.path.abspath(override)
    uid = os.geteuid()
    if uid == 0:
        return "/run/corral"
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "corral")
    runtime = f"/run/user/{uid}"
    if _private_dir_of(runtime, uid):
        return os.path.join(runtime, "corral")
    state_home = env.get("XDG_STATE_HOME")
    if state_home and os.path.isabs(state_home):
        return os.path.join(state_home, "corral")
    return os.path.join(_home(env), STATE_FALLBACK)


def _home(env) -> str:
    home = env.get("HOME")
    if not home or not os.path.isabs(home):
        try:
            import pwd

            home = pwd.getpwuid(os.geteuid()).pw_dir
        except (KeyError, ImportError):
            home = "/"
    return home


def _private_dir_of(path: str, uid: int) -> bool:
    """``path`` is a real directory (not a symlink) owned by ``uid``, writable by no one else."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def unsafe_dir_reason(path: str, st=None) -> str | None:
    """Why an existing ``path`` must not be used as a private directory, or None.

    Refused: a symlink or non-directory, another owner, group- or other-writable
    (someone else may have put files in it).
    """
    import stat

    if st is None:
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {st.st_mode & 0o7777:04o})"
    return None


def ensure_private_dir(path: str, *, parents_below: str | None = None) -> str:
    """Create ``path`` (0700) if needed; refuse one that is not ours and private.

    Only the last component is created: a missing parent (a mistyped
    CORRAL_STATE_DIR) is an OSError, never a tree of new directories;
    except below ``parents_below`` (a directory of ours: $HOME for the
    fallback state directory), where missing parents are made 0700.
    Refused (OSError, one line): a symlink, another owner, group/other-writable.
    A directory of ours that is merely readable by others is made 0700.
    """
    if parents_below and path.startswith(parents_below.rstrip("/") + "/"):
        reason = unsafe_dir_reason(parents_below)
        if reason:
            raise OSError(reason)
        parent = os.path.dirname(path.rstrip("/"))
        if not os.path.isdir(parent):
            os.makedirs(parent, 0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise OSError(
            f"{path}: parent directory {os.path.dirname(path.rstrip('/')) or '/'} does not exist "
            "(only the last component is created)"
        ) from None
    reason = unsafe_dir_reason(path)
    if reason:
        raise OSError(f"refusing the private directory {reason}")
    if os.lstat(path).st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def ensure_state_dir(path: str | None = None, env=os.environ) -> str:
    """The state directory, made if needed (see ``state_dir``): OSError (one line) if unusable."""
    path = path or state_dir(env)
    home = None
    if not env.get("CORRAL_STATE_DIR") and os.geteuid() != 0 and not env.get("XDG_RUNTIME_DIR"):
        home = _home(env)
    return ensure_private_dir(path, parents_below=home)


def valid_run_id(run_id: str) -> bool:
    return unit_names.is_run_id(run_id)


def normalize_run_id(text: str) -> str:
    """Accept ``<id>``, ``corral-<id>`` and unit names ``corral-<id>.scope``."""
    return unit_names.run_id_of(text)
