#!/bin/sh
# The command the parity matrix runs (tests/test_context_parity.py): its
# /proc status and environment as exec gave them, read before Python starts
# (Python ignores SIGPIPE and SIGXFSZ, and may coerce the C locale into
# LC_CTYPE, for itself), then context_probe.py reads the rest.
# Both opened by the shell itself, as /proc/self (its pid may not name it in
# /proc: a pid namespace without a /proc of its own); the status read by it
# too, since while a child of it runs the shell blocks its own signals (dash).
while IFS= read -r line; do printf '%s\n' "$line"; done < /proc/self/status > "$1.status"
exec 3< /proc/self/environ
cat <&3 > "$1.environ"
exec 3<&-
exec python3 "$(dirname "$0")/context_probe.py" probe "$@"
