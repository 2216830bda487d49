/* corral-gate: a library Runner's scope command, held at its gate until corral releases it.
 *
 * A Runner's host is multi-threaded, so it must not fork(): kernel/spawn.py
 * posix_spawn()s this program with its end of the gate (a unix stream
 * socket) as descriptor 3. From there it is the held child of every other
 * path (packaging/client/held.c, corral_systemd/kernel/gate.py): a session
 * of its own, the child's signal defaults, "r" once it waits; then the
 * command's argv, environment, working directory, umask and stdio from
 * corral's request, and exec as Python's os.execvpe does it (never /bin/sh
 * for a file the kernel will not execute); a failed exec's errno back on the
 * gate, exit 127; the gate closed before a request: exit 125, nothing ran.
 * Its Python twin is kernel/gate.py's ``held_on_fd3`` (where this was not built).
 */
#define _GNU_SOURCE
#include <fcntl.h>

static const char *prog = "corral-gate";

#include "../client/held.c"

int main(void) {
    /* Descriptor 3 came by dup2, which clears close-on-exec: set it again, so
     * the command never holds the gate and its exec shows as end of file. */
    if (fcntl(3, F_SETFD, FD_CLOEXEC) < 0)
        return 125;
    held_child(3); /* never returns */
    return 125;
}
