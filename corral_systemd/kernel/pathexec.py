"""A command's exec with os's PATH search, without os's import of warnings.

``os.execvpe`` finds the program through ``os.get_exec_path``, which imports
the warnings module: half a millisecond in every command's child between its
release and its exec. Every child that executes a command in Python does it
here: the in-process child (``kernel.spawn.fork_command``) and a held child
(``kernel.gate``: the Python client's, corral-gate's Python twin). A module of
its own, importing only ``os``: both of theirs load it at no other cost.
"""

import os


def execvpe(file, argv: list, env: dict | None) -> None:
    """Execute ``argv`` as ``os.execvpe`` does (``os.execvp`` when ``env`` is
    None): a ``file`` with a slash as it is, else each directory of ``env``'s
    PATH (str or bytes keys; ``os.defpath`` if it has none) in turn. Raises the
    first error other than ENOENT/ENOTDIR, else the last: os's own rule, which
    ``kernel.spawn.exec_errno`` reads."""

    def execute(path) -> None:
        if env is None:
            os.execv(path, argv)  # this process's own environment, as exec gives it
        else:
            os.execve(path, argv, env)

    name = os.fsencode(file)
    if b"/" in name:
        execute(file)
    path = os.environ.get("PATH") if env is None else env.get("PATH", env.get(b"PATH"))
    first: OSError | None = None
    last: OSError = FileNotFoundError(2, "No such file or directory")
    for directory in os.fsencode(os.defpath if path is None else path).split(b":"):
        try:
            execute(os.path.join(directory, name))
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
        except OSError as exc:
            last = exc
            first = first or exc
    raise first or last
