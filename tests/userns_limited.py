"""Run a command as a user who may make no user namespace, without touching
the machine's sysctls: ``python userns_limited.py UID -- ARGV...`` (as root).

A child makes a user namespace of its own; root (this process, outside it)
maps uid and gid 0 and ``UID`` into it; inside, as its root, the child sets
``user.max_user_namespaces`` to 0 -- a limit of that namespace alone, which
the kernel checks for every namespace made below it -- then becomes ``UID``
and execs ``ARGV``. Exits with the command's status.
"""

import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000


def main(uid: int, argv: list[str]) -> int:
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWUSER) != 0:
            os._exit(99)
        os.write(ready_w, b"x")
        if os.read(go_r, 1) != b"x":
            os._exit(99)
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        os.execvp(argv[0], argv)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) != b"x":
        os.waitpid(pid, 0)
        return 99
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 0 1\n{uid} {uid} 1\n")
    os.write(go_w, b"x")
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    sep = sys.argv.index("--")
    sys.exit(main(int(sys.argv[1]), sys.argv[sep + 1 :]))
