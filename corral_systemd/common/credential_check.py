"""How a service's ``--credential`` delivery is checked (see ``credentials.py``).

systemd delivers a service's credentials itself (LoadCredential=); an
ExecStartPre= (``CHECK_SCRIPT``) proves, inside the unit and before the
command, that each one arrived, and a failed start is explained from the
exit statuses below. Here, beside the engines, so the systemd engine need
not import the credentials module (state: private directories, the
registry) from a layer above it.
"""

import os

MAX_CREDENTIAL_SIZE = 1024 * 1024  # systemd's limit too
#: Exit status of the service's ExecStartPre= check when a credential is missing.
CHECK_FAILED = 87
#: systemd's EXIT_CREDENTIALS: the manager could not load a credential.
EXIT_CREDENTIALS = 243
#: The ExecStartPre= check, run by /bin/sh with the NAMEs as arguments. It
#: must contain neither "${" nor "$$": systemd expands those in command lines.
CHECK_SCRIPT = (
    f'for n do [ -f "$CREDENTIALS_DIRECTORY/$n" ] && [ -r "$CREDENTIALS_DIRECTORY/$n" ] || exit {CHECK_FAILED}; done'
)


def source_problem(pairs: list[tuple[str, str]]) -> str | None:
    """Why a source could not be loaded, as corral sees it ("NAME: PATH: reason"), or None.

    Only to explain a failure the manager reported; never reads the contents.
    """
    import stat

    for name, path in pairs:
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                return f"{name}: {path} is not a regular file"
            if st.st_size > MAX_CREDENTIAL_SIZE:
                return f"{name}: {path} is larger than 1 MiB"
            os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
        except OSError as exc:
            return f"{name}: {path}: {exc.strerror}"
    return None
