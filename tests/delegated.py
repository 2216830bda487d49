"""A delegated cgroup v2 subtree for the cgroup tier's tests, on any host with cgroup2.

A container with a writable cgroup shows its processes ``0::/`` in
/proc/self/cgroup and a cgroup2 mount of its own subtree at /sys/fs/cgroup.
``program`` makes that for one corral: a fresh group ``G`` below this host's
cgroup2 mount (``/sys/fs/cgroup/unified`` on a hybrid host, ``/sys/fs/cgroup``
on a pure v2 one), a process moved into it, then ``unshare --cgroup --mount``
(G becomes the namespace's root) and cgroup2 mounted at /sys/fs/cgroup in
that private mount namespace; corral is exec'd there. ``shared=True`` puts a
``sleep`` in G first, as a container's shell would be (the no-internal-processes
case). ``pid_namespaces=False`` makes that an ``unshare --user --map-root-user``
too, whose ``user.max_pid_namespaces`` is 0: no pid namespace can be had
below it (ENOSPC), as where user namespaces are forbidden, so the cgroup tier
runs the command without one. The wrapper waits for corral, then kills what is left in G through
``cgroup.kill`` (G is its own) and removes G; it exits with corral's status,
or 99 when G could not be removed (something was left in it), 96 when G did
not empty by itself within ``wait_empty`` seconds of corral's end.
"""

import os
import shutil

from corral_systemd.kernel.cgroupfs import Mounts

#: The wrapper: $1 the host's cgroup2 mount, $2 "shared" or "alone", $3 how many tenths of a
#: second to wait for G to empty by itself once corral is gone (0: none), $4 "nopidns" or
#: "pidns" (see ``pid_namespaces``), then corral's argv.
_WRAP = r"""
u=$1; how=$2; wait=$3; nopidns=$4; shift 4
g=$u/corral-tiers-test-$$
mkdir "$g" || exit 98
if [ "$how" = shared ]; then
    sh -c 'echo $$ >"$1/cgroup.procs" && exec sleep 3600' sh "$g" &
    other=$!
    while ! grep -qx "$other" "$g/cgroup.procs"; do sleep 0.01; done
fi
sh -c 'g=$1; nopidns=$2; shift 2; echo $$ >"$g/cgroup.procs" || exit 98
    if [ "$nopidns" = nopidns ]; then
        exec unshare --user --map-root-user --cgroup --mount sh -c \
            "echo 0 >/proc/sys/user/max_pid_namespaces && mount -t cgroup2 none /sys/fs/cgroup && exec \"\$@\"" sh "$@"
    fi
    exec unshare --cgroup --mount sh -c "mount -t cgroup2 none /sys/fs/cgroup && exec \"\$@\"" sh "$@"
' sh "$g" "$nopidns" "$@"
rc=$?
i=0
while [ $i -lt "$wait" ] && grep -qx "populated 1" "$g/cgroup.events"; do sleep 0.1; i=$((i + 1)); done
[ "$wait" -gt 0 ] && grep -qx "populated 1" "$g/cgroup.events" && rc=96   # corral's run outlived it
if [ "$how" = shared ]; then
    grep -qx "$other" "$g/cgroup.procs" || rc=97   # the other process was not corral's to touch
fi
echo 1 >"$g/cgroup.kill"
for i in $(seq 100); do
    find "$g" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
    rmdir "$g" 2>/dev/null && exit $rc
    sleep 0.05
done
exit 99
"""


def unavailable() -> str | None:
    """Why the cgroup tier cannot be set up here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (a cgroup namespace, a mount namespace, a cgroup2 mount)"
    if shutil.which("unshare") is None:
        return "no unshare"
    unified = Mounts().unified
    if unified is None:
        return "no cgroup2 mount"
    if not os.access(os.path.join(unified, "cgroup.procs"), os.W_OK):
        return f"{unified} is not writable"
    return None


def program(
    corral: list[str], *, shared: bool = False, wait_empty: float = 0, pid_namespaces: bool = True
) -> list[str]:
    """``corral``'s argv run inside a fresh delegated subtree (see the module).
    ``wait_empty``: once corral is gone, wait up to that many seconds for the
    subtree to empty by itself before killing what is left (exit 96 then)."""
    how = "shared" if shared else "alone"
    from modes import pid_namespaces_to_refuse

    namespaces = "pidns" if pid_namespaces or not pid_namespaces_to_refuse() else "nopidns"
    return ["sh", "-c", _WRAP, "sh", Mounts().unified, how, str(int(wait_empty * 10)), namespaces, *corral]


def controllers() -> set[str]:
    """The controllers a child group of the host's cgroup2 root can have
    (a hybrid host's unified hierarchy has none: no kernel limits)."""
    unified = Mounts().unified
    try:
        with open(os.path.join(unified, "cgroup.subtree_control")) as f:
            return set(f.read().split())
    except OSError:
        return set()
