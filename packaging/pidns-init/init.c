/* corral-pidns-init: the init of a run's PID namespace (the pidns tier), as
 * a program of its own, so that the namespace's pid 1 is not a copy of the
 * Python interpreter (issue 38: one Python process per run).
 *
 * corral clones its child into the namespaces and, in that child, does what
 * must be done before an exec (corral_systemd/engines/pidns_init.prepare:
 * PR_SET_PDEATHSIG and the look at corral's pidfd, a session of its own, the
 * user namespace's maps, the mount namespace and its own /proc); then it
 * execs this program, which does exactly what pidns_init.serve does in
 * Python and speaks the same protocol with corral_systemd/engines/pidns.py:
 *
 *   corral-pidns-init STATUS_FD CONTROL_FD UNSHARE
 *
 * STATUS_FD (lines to corral) and CONTROL_FD (the start message, then one
 * byte that opens the gate) are sockets; UNSHARE is "UID:GID" where one more
 * user namespace must be made below this one (uid 0 of a user namespace
 * corral made: the mounts then come as a locked unit), else "-". The start
 * message is a byte with the command's three stdio descriptors, then an
 * 8-byte big-endian length and that many bytes of NUL-terminated fields:
 * umask ("" or octal), pty ("0"/"1"), cwd ("" for corral's), argc, argv...,
 * envc, NAME=VALUE..., maskc (0 here: a sealed run takes the Python init).
 *
 * Guarantees, as the Python init's (see its docstring):
 * - its own descriptors (the channels, the received stdio) are close-on-exec
 *   and fds 0-2 read /dev/null: the command gets only its stdio from here,
 *   and those corral was given to pass on (not close-on-exec) as in every tier;
 * - not dumpable from the start message until the command's execve (the
 *   command's process makes itself dumpable just before it), so a command
 *   of the init's uid can neither ptrace it nor open /proc/1/fd/N; the
 *   address space is the user namespace's it exec'd in, above any the
 *   command gets capabilities in (UNSHARE is done here, after the exec);
 * - the command is held at a gate after its fork ("fork PID"), exec'd only
 *   on corral's byte; an exec failure comes back as "exec ERRNO" only from a
 *   child that then exited 127 (a report forged by the command is not
 *   believed); then it reaps every process of the namespace, says
 *   "exit STATUS" for the command's main process and exits when no child is
 *   left. Every catchable signal that would end it is ignored (pid 1 gets
 *   none from inside it does not handle; SIGKILL from corral ends the whole
 *   namespace).
 * Failure modes: "setup WHY" and exit 125 before the command exists.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int status_fd = -1;

/* One line to corral; corral gone is nobody to tell (MSG_NOSIGNAL: no SIGPIPE). */
static void say(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = sizeof line - 2;
    for (int i = 0; i < n; i++)
        if (line[i] == '\n')
            line[i] = ' ';
    line[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = send(status_fd, line + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        off += (int)w;
    }
}

static void __attribute__((noreturn)) setup_failed(const char *what)
{
    say("setup %s: %s", what, strerror(errno));
    _exit(125);
}

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    int err = errno;
    close(fd);
    errno = err;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* One more user namespace, its uid and gid mapped to themselves (kernel.namespaces.map_self). */
static void unshare_user(const char *ids)
{
    unsigned uid, gid;
    char text[64];
    if (sscanf(ids, "%u:%u", &uid, &gid) != 2) {
        errno = EINVAL;
        setup_failed("unshare");
    }
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0); /* its /proc/self files are its own to write */
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
        setup_failed("unshare");
    if (write_file("/proc/self/setgroups", "deny") != 0)
        setup_failed("setgroups");
    snprintf(text, sizeof text, "%u %u 1", uid, uid);
    if (write_file("/proc/self/uid_map", text) != 0)
        setup_failed("uid_map");
    snprintf(text, sizeof text, "%u %u 1", gid, gid);
    if (write_file("/proc/self/gid_map", text) != 0)
        setup_failed("gid_map");
}

/* corral's stop signals (kernel/signals.py: every catchable one whose default ends a process). */
static const int stop_signals[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGTRAP,   SIGABRT, SIGUSR1, SIGUSR2, SIGALRM,
                                   SIGTERM, SIGSTKFLT, SIGXCPU, SIGVTALRM, SIGPROF, SIGIO,   SIGPWR};

static void set_stop_signals(void (*how)(int))
{
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        signal(stop_signals[i], how);
    for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
        signal(sig, how);
}

static int cloexec(int fd)
{
    int flags = fcntl(fd, F_GETFD);
    return flags < 0 ? -1 : fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

/* Exactly ``size`` bytes from ``fd`` (fewer: corral is gone, exit). */
static void read_exactly(int fd, void *buf, size_t size)
{
    for (size_t got = 0; got < size;) {
        ssize_t n = read(fd, (char *)buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            _exit(0);
        got += (size_t)n;
    }
}

struct start {
    char *umask, *pty, *cwd;
    char **argv, **env;
};

/* The next NUL-terminated field of the message (NULL: none left). */
static char *field(char **at, char *end)
{
    if (*at >= end)
        return NULL;
    char *f = *at, *nul = memchr(f, '\0', (size_t)(end - f));
    if (nul == NULL)
        return NULL;
    *at = nul + 1;
    return f;
}

static char **fields(char **at, char *end)
{
    char *count = field(at, end);
    if (count == NULL)
        return NULL;
    unsigned long n = strtoul(count, NULL, 10);
    if (n > (unsigned long)(end - *at))
        return NULL;
    char **list = calloc(n + 1, sizeof *list);
    if (list == NULL)
        return NULL;
    for (unsigned long i = 0; i < n; i++)
        if ((list[i] = field(at, end)) == NULL)
            return NULL;
    return list;
}

static int parse_start(char *data, size_t size, struct start *s)
{
    char *at = data, *end = data + size;
    char **masks;
    if ((s->umask = field(&at, end)) == NULL || (s->pty = field(&at, end)) == NULL ||
        (s->cwd = field(&at, end)) == NULL || (s->argv = fields(&at, end)) == NULL || s->argv[0] == NULL ||
        (s->env = fields(&at, end)) == NULL || (masks = fields(&at, end)) == NULL)
        return -1;
    return masks[0] == NULL ? 0 : -1; /* a sealed run is the Python init's */
}

static const char *env_get(char **env, const char *name)
{
    size_t len = strlen(name);
    for (; *env != NULL; env++)
        if (strncmp(*env, name, len) == 0 && (*env)[len] == '=')
            return *env + len + 1;
    return NULL;
}

static int is_kind(const char *path, mode_t kind)
{
    struct stat st;
    return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

/* execvpe with the *command's* PATH (glibc's reads this process's), as
 * Python's os.execvpe: no shell for ENOEXEC; the first error other than
 * ENOENT/ENOTDIR is the one reported. Returns the errno as the shell reports
 * it (kernel.spawn.exec_errno: a directory is EISDIR, a bare name PATH finds
 * only as directories ENOENT). */
static int exec_command(char **argv, char **env)
{
    const char *name = argv[0];
    if (strchr(name, '/') != NULL) {
        execve(name, argv, env);
        return errno == EACCES && is_kind(name, S_IFDIR) ? EISDIR : errno;
    }
    const char *path = env_get(env, "PATH");
    if (path == NULL)
        path = "/bin:/usr/bin"; /* os.defpath */
    int saved = 0, last = ENOENT, regular = 0;
    for (const char *dir = path;; dir++) {
        const char *colon = strchrnul(dir, ':');
        char candidate[4096];
        int len = colon == dir ? snprintf(candidate, sizeof candidate, "%s", name)
                               : snprintf(candidate, sizeof candidate, "%.*s/%s", (int)(colon - dir), dir, name);
        if (len > 0 && (size_t)len < sizeof candidate) {
            regular |= is_kind(candidate, S_IFREG);
            execve(candidate, argv, env);
            last = errno;
            if (saved == 0 && last != ENOENT && last != ENOTDIR)
                saved = last;
        }
        if (*colon == '\0')
            break;
        dir = colon;
    }
    int err = saved ? saved : last;
    return err == EACCES && !regular ? ENOENT : err;
}

/* The command's process, after the fork: as kernel.spawn.fork_command's child. */
static void __attribute__((noreturn)) command(struct start *s, const int stdio[3], int gate_r, int err_w)
{
    int err;
    setsid();
    set_stop_signals(SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGWINCH, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    char go = 0;
    while (read(gate_r, &go, 1) < 0 && errno == EINTR)
        ;
    if (go != 'x')
        _exit(127); /* corral gave up on it */
    for (int target = 0; target < 3; target++) {
        int ok = stdio[target] != target ? dup2(stdio[target], target) : fcntl(target, F_SETFD, 0);
        if (ok < 0)
            goto failed;
    }
    if (s->pty[0] == '1' && ioctl(0, TIOCSCTTY, 0) != 0)
        goto failed;
    if (s->cwd[0] != '\0' && chdir(s->cwd) != 0)
        goto failed;
    if (s->umask[0] != '\0')
        umask((mode_t)strtoul(s->umask, NULL, 8));
    /* The command's process, as its exec makes it anyway (before: the init's, not dumpable). */
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    err = exec_command(s->argv, s->env);
    goto report;
failed:
    err = errno;
report:;
    char text[16];
    int n = snprintf(text, sizeof text, "%d", err ? err : EIO);
    if (write(err_w, text, (size_t)n) < 0) {
        /* corral's init is gone: nobody to tell */
    }
    _exit(127);
}

/* The child exited 127 (left unreaped) as it does once it has written its
 * report: a report from anywhere else (the command, through pidfd_getfd) is
 * not believed. Bounded: the child exits as soon as it has written. */
static int wrote_report(pid_t pid)
{
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd >= 0) {
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        int ready = poll(&p, 1, 10000);
        close(pidfd);
        if (ready <= 0)
            return 0;
    }
    siginfo_t info = {0};
    if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0)
        return 0;
    return info.si_pid == pid && info.si_code == CLD_EXITED && info.si_status == 127;
}

/* The command, forked from the start message; its pid. */
static pid_t start(int control)
{
    char head = 0;
    int stdio[3];
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = &head, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t got;
    while ((got = recvmsg(control, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
        ;
    if (got <= 0)
        _exit(0); /* corral sent none */
    int nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            if (nfds > 3)
                nfds = 3;
            memcpy(stdio, CMSG_DATA(c), (size_t)nfds * sizeof(int));
        }
    if (nfds != 3) {
        errno = EBADMSG;
        setup_failed("start message");
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* before the command exists */
    unsigned char be[8];
    read_exactly(control, be, sizeof be);
    uint64_t size = 0;
    for (int i = 0; i < 8; i++)
        size = size << 8 | be[i];
    if (size > (64u << 20)) {
        errno = E2BIG;
        setup_failed("start message");
    }
    char *data = malloc(size + 1);
    if (data == NULL)
        setup_failed("start message");
    read_exactly(control, data, size);
    struct start s;
    if (parse_start(data, size, &s) != 0) {
        errno = EBADMSG;
        setup_failed("start message");
    }

    int report[2], gate[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, report) != 0)
        setup_failed("socketpair");
    shutdown(report[0], SHUT_WR); /* one way: the child's report to this process */
    shutdown(report[1], SHUT_RD);
    if (pipe2(gate, O_CLOEXEC) != 0)
        setup_failed("pipe");
    pid_t child = fork();
    if (child < 0)
        setup_failed("fork");
    if (child == 0) {
        close(gate[1]);
        close(report[0]);
        command(&s, stdio, gate[0], report[1]);
    }
    close(gate[0]);
    close(report[1]);
    for (int i = 0; i < 3; i++)
        close(stdio[i]);
    say("fork %d", (int)child);
    /* The gate opens on corral's byte: it has found the child in its own /proc and holds a
     * pidfd for it (or corral is gone: end of file, and this process with it). */
    char word = 0;
    while (read(control, &word, 1) < 0 && errno == EINTR)
        ;
    if (word != 'k') {
        kill(child, SIGKILL);
        _exit(0);
    }
    close(control);
    if (write(gate[1], "x", 1) < 0) {
        /* the child gave up before the gate: its report says why */
    }
    close(gate[1]);
    char text[16];
    size_t have = 0;
    ssize_t n;
    while (have < sizeof text - 1 && ((n = read(report[0], text + have, sizeof text - 1 - have)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0)
            have += (size_t)n;
    close(report[0]);
    text[have] = '\0';
    if (have > 0 && wrote_report(child)) {
        waitpid(child, NULL, 0);
        say("exec %d", atoi(text));
        _exit(0);
    }
    say("run");
    return child;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "corral-pidns-init: run by corral only (STATUS_FD CONTROL_FD UNSHARE)\n");
        return 125;
    }
    status_fd = atoi(argv[1]);
    int control = atoi(argv[2]);
    if (cloexec(status_fd) != 0 || cloexec(control) != 0)
        return 125;
    if (strcmp(argv[3], "-") != 0)
        unshare_user(argv[3]);
    set_stop_signals(SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGWINCH, SIG_DFL);
    /* Its stdio (corral's) reads /dev/null: the command can open the init's descriptors as root. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0)
        setup_failed("/dev/null");
    for (int fd = 0; fd < 3; fd++)
        if (fd != status_fd && fd != control && fd != null && dup3(null, fd, O_CLOEXEC) < 0)
            setup_failed("/dev/null");
    if (null > 2)
        close(null);
    say("ready");
    pid_t main_pid = start(control);
    for (;;) {
        int wstatus;
        pid_t pid = waitpid(-1, &wstatus, 0);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            _exit(0); /* no child left: every process of the namespace is gone */
        }
        if (pid == main_pid)
            say("exit %d", wstatus);
    }
}
