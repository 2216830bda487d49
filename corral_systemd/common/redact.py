"""Best-effort redaction of secret-looking command-line arguments.

Shared by the run registry (its entries, detached processes' argv, ``corralctl
ps``) and the run record (``--json``, the library's ``RunResult``), so that
neither keeps in clear what the other hides. Imports nothing: the registry is
on corral's hot path, and engines must not import the registry.

What is redacted: the value after ``Authorization:``-like headers and
``Bearer``, ``NAME=VALUE`` where NAME looks like a secret (``password``,
``token``, ``api_key``...), the argument following an option that looks
like one (``--password X``), and the password of a URL (``https://u:p@host``).
"""

_SECRET_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "token",
    "secret",
    "apikey",
    "api-key",
    "api_key",
    "credential",
    "private-key",
    "private_key",
    "access-key",
    "access_key",
)
_SECRET_HEADERS = ("authorization:", "proxy-authorization:", "cookie:", "x-api-key:", "private-token:", "x-auth-token:")
REDACTED = "[redacted]"


def _secretish(name: str) -> bool:
    name = name.lower()
    return any(word in name for word in _SECRET_WORDS)


def redact_argv(argv) -> list[str]:
    """argv with values that look like secrets replaced (best effort)."""
    out = []
    redact_next = False
    for arg in argv:
        arg = str(arg)
        low = arg.lower()
        if redact_next:
            out.append(REDACTED)
            redact_next = False
            continue
        if low.startswith(_SECRET_HEADERS):
            out.append(arg.split(":", 1)[0] + ": " + REDACTED)
        elif "bearer " in low:
            i = low.index("bearer ")
            out.append(arg[: i + 7] + REDACTED)
        elif "=" in arg and _secretish(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        elif "://" in arg and "@" in arg.split("://", 1)[1].split("/", 1)[0]:
            scheme, rest = arg.split("://", 1)
            userinfo, host = rest.split("@", 1)
            user = userinfo.split(":", 1)[0]
            out.append(f"{scheme}://{user}:{REDACTED}@{host}" if ":" in userinfo else arg)
        else:
            out.append(arg)
            redact_next = low.startswith("-") and _secretish(low.lstrip("-")) and "=" not in low
    return out
