/* The command's process held at a gate (corral_systemd/kernel/gate.py), in C.
 *
 * #included by corral.c (the compiled client forks it for a served run) and
 * by packaging/gate/gate.c (corral-gate: a library Runner's scope command,
 * posix_spawn'd by kernel/spawn.py), so both hold and release a command the
 * one way. The includer defines _GNU_SOURCE and ``prog`` (its name, for the
 * one message here) first.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- growing byte buffers --------------------------------------------- */

struct buf {
    char *data;
    size_t len, cap;
};

static void buf_need(struct buf *b, size_t more) {
    if (b->len + more <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) {
        fprintf(stderr, "%s: out of memory\n", prog);
        exit(125);
    }
    b->data = data;
    b->cap = cap;
}

static void buf_add(struct buf *b, const void *data, size_t len) {
    if (len == 0)
        return; /* nothing to copy (and no buffer yet, perhaps) */
    buf_need(b, len);
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

/* client.py's stop_signals(): every catchable signal whose default action
 * would end this process, except the faults (SEGV, BUS, ILL, FPE, SYS) and
 * PIPE, XFSZ (ignored here, as Python ignores them). */
static const int stop_signals[] = {SIGHUP, SIGINT, SIGQUIT, SIGTRAP, SIGABRT, SIGUSR1, SIGUSR2, SIGALRM,
                                   SIGTERM, SIGSTKFLT, SIGXCPU, SIGVTALRM, SIGPROF, SIGIO, SIGPWR};

/* ---- the command's process, held at a gate (corral_systemd/kernel/gate.py) -- */

/* What the child of a served run does before it is the command: a session of
 * its own; every signal of kernel/signals.py's CHILD_DEFAULTS at its default
 * action (the stop signals, real-time ones included, SIGPIPE, SIGXFSZ,
 * SIGCHLD, SIGWINCH), the others as the caller had them; an empty mask; then
 * it waits for the service's request on its end of the gate. */
static const int child_defaults[] = {SIGPIPE, SIGXFSZ, SIGCHLD, SIGWINCH};

static ssize_t read_some(int fd, void *data, size_t len) {
    for (;;) {
        ssize_t n = read(fd, data, len);
        if (n >= 0 || errno != EINTR)
            return n;
    }
}

/* The request (see gate.py): "LENGTH\n" with the command's stdin, stdout and
 * stderr, then LENGTH bytes of NUL-terminated fields. 0 and *payload, *fds
 * set, or -1 (end of file, or anything malformed). */
static int receive_request(int gate, struct buf *payload, int fds[3]) {
    char head[40];
    size_t got = 0;
    int nfds = 0;
    while (got == 0 || !memchr(head, '\n', got)) {
        union {
            char space[CMSG_SPACE(sizeof(int) * 3)];
            struct cmsghdr align;
        } control;
        struct iovec iov = {head + got, sizeof head - 1 - got};
        struct msghdr m = {0};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = control.space;
        m.msg_controllen = sizeof control.space;
        if (iov.iov_len == 0)
            return -1;
        ssize_t n = recvmsg(gate, &m, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
                    if (nfds < 3)
                        fds[nfds++] = ((int *)CMSG_DATA(c))[i];
        got += (size_t)n;
    }
    head[got] = 0;
    char *newline = memchr(head, '\n', got), *stop;
    unsigned long length = strtoul(head, &stop, 10);
    if (nfds != 3 || stop != newline || length == 0 || length > (8u << 20))
        return -1;
    size_t already = got - (size_t)(newline + 1 - head);
    buf_add(payload, newline + 1, already);
    while (payload->len < length) {
        buf_need(payload, length - payload->len);
        ssize_t n = read_some(gate, payload->data + payload->len, length - payload->len);
        if (n <= 0)
            return -1;
        payload->len += (size_t)n;
    }
    return payload->len == length ? 0 : -1;
}

/* The next NUL-terminated field of the payload, or NULL past its end. */
static char *next_field(struct buf *payload, size_t *at) {
    if (*at >= payload->len)
        return NULL;
    char *field = payload->data + *at, *nul = memchr(field, 0, payload->len - *at);
    if (!nul)
        return NULL;
    *at = (size_t)(nul - payload->data) + 1;
    return field;
}

/* exec as Python's os.execvpe does it (the in-process child's call): a name
 * with a slash as it is, else each entry of the environment's PATH (or
 * os.defpath) in turn; the error is the first one that is not ENOENT or
 * ENOTDIR, else the last. Never /bin/sh for an ENOEXEC file, as glibc's
 * execvpe would. */
static int exec_like_python(char **argv, char **envp, const char *path) {
    const char *file = argv[0];
    if (strchr(file, '/')) {
        execve(file, argv, envp);
        return errno;
    }
    int saved = 0, last = ENOENT;
    const char *p = path ? path : "/bin:/usr/bin";
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        char full[PATH_MAX];
        int len = n == 0 ? snprintf(full, sizeof full, "%s", file)
                         : snprintf(full, sizeof full, "%.*s/%s", (int)n, p, file);
        if (len < 0 || (size_t)len >= sizeof full)
            errno = ENAMETOOLONG; /* as execve says of a path that long: never a cut one executed */
        else
            execve(full, argv, envp);
        last = errno;
        if (last != ENOENT && last != ENOTDIR && !saved)
            saved = last;
        if (!colon)
            break;
        p = colon + 1;
    }
    return saved ? saved : last;
}

/* kernel/spawn.py's exec_errno: EACCES for a path to a directory is EISDIR;
 * for a bare name that PATH finds only as directories, ENOENT. */
static int exec_errno(const char *name, int err, const char *path) {
    struct stat st;
    if (err != EACCES)
        return err;
    if (strchr(name, '/'))
        return stat(name, &st) == 0 && S_ISDIR(st.st_mode) ? EISDIR : err;
    const char *p = path ? path : "/bin:/usr/bin";
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        char full[PATH_MAX];
        snprintf(full, sizeof full, "%.*s%s%s", (int)n, p, n ? "/" : "", name);
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode))
            return err;
        if (!colon)
            return ENOENT;
        p = colon + 1;
    }
}

static void held_child(int gate) {
    setsid();
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        sigaction(stop_signals[i], &dfl, NULL);
    for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
        sigaction(s, &dfl, NULL);
    for (size_t i = 0; i < sizeof child_defaults / sizeof *child_defaults; i++)
        sigaction(child_defaults[i], &dfl, NULL);
    /* glibc's own signals below SIGRTMIN (SIGCANCEL, SIGSETXID): its
     * posix_spawn leaves them ignored in the program it starts (corral-gate),
     * and an ignored signal stays ignored across exec, where a forked
     * child's exec has them at their default. glibc's sigaction refuses
     * them: the system call, with a zeroed kernel sigaction (SIG_DFL, no
     * flags, an empty mask: every ABI's layout fits in it). */
    unsigned long dfl_raw[8] = {0};
    for (int s = 32; s < SIGRTMIN; s++)
        syscall(SYS_rt_sigaction, s, dfl_raw, NULL, (size_t)(_NSIG / 8));
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (write(gate, "r", 1) != 1) /* it waits at its gate (gate.py's READY) */
        _exit(125);

    struct buf payload = {0};
    int fds[3];
    if (receive_request(gate, &payload, fds) < 0)
        _exit(125); /* the gate closed: nothing runs */
    size_t at = 0;
    char *cwd = next_field(&payload, &at), *mask = next_field(&payload, &at), *count = next_field(&payload, &at);
    if (!count)
        _exit(125);
    long argc = strtol(count, NULL, 10);
    if (argc < 1 || argc > 1 << 20)
        _exit(125);
    char **argv = calloc((size_t)argc + 1, sizeof *argv);
    for (long i = 0; argv && i < argc; i++)
        if (!(argv[i] = next_field(&payload, &at)))
            _exit(125);
    char *envcount = next_field(&payload, &at);
    long envc = envcount ? strtol(envcount, NULL, 10) : -1;
    if (!argv || envc < 0 || envc > 1 << 20)
        _exit(125);
    char **envp = calloc((size_t)envc + 1, sizeof *envp);
    const char *path = NULL;
    for (long i = 0; envp && i < envc; i++) {
        if (!(envp[i] = next_field(&payload, &at)))
            _exit(125);
        if (!strncmp(envp[i], "PATH=", 5))
            path = envp[i] + 5;
    }
    if (!envp)
        _exit(125);
    /* Received in order into the lowest free numbers, so fds[t] >= t and no
     * dup2 below overwrites a descriptor still to be copied. dup2 clears
     * close-on-exec on its target, except onto itself (a closed 0, 1 or 2
     * here: it arrived there, close-on-exec): then it is cleared by hand. */
    for (int target = 0; target < 3; target++)
        if (fds[target] == target ? fcntl(target, F_SETFD, 0) < 0 : dup2(fds[target], target) < 0)
            _exit(125);
    for (int i = 0; i < 3; i++)
        if (fds[i] > 2)
            close(fds[i]);
    int err = 0;
    if (*cwd && chdir(cwd) < 0)
        err = exec_errno(argv[0], errno, path); /* as the in-process child reports it */
    if (!err && *mask)
        umask((mode_t)strtoul(mask, NULL, 8));
    if (!err)
        err = exec_errno(argv[0], exec_like_python(argv, envp, path), path);
    char report[16];
    int n = snprintf(report, sizeof report, "%d", err);
    if (write(gate, report, (size_t)n) < 0) {
        /* the service is gone: nothing to tell */
    }
    _exit(127);
}
