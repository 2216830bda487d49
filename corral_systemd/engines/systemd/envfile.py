"""A service's command and environment, as the manager will see them.

- ``resolve_for_service``: the executable, found as a scope's exec finds it
  (ExecError 127/126 before anything starts);
- ``valid_env``: what systemd accepts in an environment assignment;
- ``EnvFile``: the environment as a private file the unit names in
  EnvironmentFiles=, so no value is in the unit's properties.
"""

import os
import re

from ...kernel.spawn import resolve_in_cwd

#: What systemd accepts in Environment= (env_assignment_is_valid): a name
#: of [A-Za-z0-9_] not starting with a digit, a value with no control
#: characters other than tab and newline.
_ENV_NAME = re.compile(r"(?![0-9])[A-Za-z0-9_]+")
_ENV_VALUE = re.compile(r"[^\x00-\x08\x0b-\x1f\x7f]*")


def valid_env(key: str, value: str) -> bool:
    if _ENV_NAME.fullmatch(key) is None or _ENV_VALUE.fullmatch(value) is None:
        return False
    try:
        value.encode("utf-8")  # systemd wants valid UTF-8; undecodable bytes arrive as surrogates
    except UnicodeEncodeError:
        return False
    return True


def resolve_for_service(name: str, env: dict, cwd: str | None) -> str:
    """The service's executable, found as a scope's exec finds it (after
    chdir to the command's cwd, with its PATH), or ExecError: 127 for not
    found (also a missing cwd, as chdir gives), 126 for not executable, a
    directory, permission denied."""
    # Relative PATH entries (and empty ones: the cwd) are relative to the command's cwd.
    return resolve_in_cwd(name, env.get("PATH", os.defpath), cwd)


def _env_file_value(value: str) -> str:
    """``value`` as systemd's environment-file parser reads it back exactly:
    double-quoted, with backslash before each of ``"`` ``\\`` `` ` `` ``$``
    (the characters it unescapes there); newlines and tabs stand as they are."""
    for char in ("\\", '"', "`", "$"):
        value = value.replace(char, "\\" + char)
    return f'"{value}"'


def _env_file_dirs() -> list[str]:
    """Where a service's environment file may go: a directory of ours on a
    tmpfs that the manager can read. The user's runtime directory (a user
    manager runs as the user; root's system manager reads anything), /run
    for root, else /dev/shm."""
    uid = os.geteuid()
    out = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        out.append(os.path.join(runtime, "corral-env"))
    if uid == 0:
        out.append("/run/corral-env")
    out.append(f"/dev/shm/corral-env-{uid}")
    return out


class EnvFile:
    """A service's environment as a 0600 file in a private directory (0700,
    ours, not a symlink; made if missing), named by the run id and 16 random
    bytes, written O_EXCL. OSError if no such directory can be had."""

    def __init__(self, run_id: str, environment: dict):
        import stat

        data = "".join(f"{key}={_env_file_value(value)}\n" for key, value in environment.items())
        encoded = data.encode("utf-8")
        errors = []
        for directory in _env_file_dirs():
            try:
                try:
                    os.mkdir(directory, 0o700)
                except FileExistsError:
                    pass
                st = os.lstat(directory)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                    raise OSError(f"{directory} is not a private directory of ours")
                path = os.path.join(directory, f"{run_id}.{os.urandom(16).hex()}.env")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                errors.append(str(exc))
                continue
            try:
                view = memoryview(encoded)
                while view:
                    view = view[os.write(fd, view) :]
            except BaseException:
                os.unlink(path)
                raise
            finally:
                os.close(fd)
            self.path = path
            return
        raise OSError("; ".join(errors))

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
