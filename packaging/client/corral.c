/*
 * corral and corral-enforced, compiled: hand the run to the corral service
 * (io.corral.Run over Varlink), or run it in-process through Python.
 *
 * The same client as corral_systemd/client.py, without the interpreter's
 * start-up (about 15 ms of every run here, half of what systemd-run takes
 * for a whole run). The .deb installs it as /usr/bin/corral and
 * /usr/bin/corral-enforced; pip installs keep the Python client. Each does,
 * in this order:
 *
 *   0. a --background command line of a session (its id: --session ID or
 *      CORRAL_SESSION): the session's holder is asked to be its front
 *      (io.corral.SessionHolder.Front at @corral-session/UID/ID, this uid's
 *      alone; front_via_holder): argv, this client's version, stdin, stdout and
 *      stderr; the holder reads the line as corral does and forks the front,
 *      made this process's context as the kernel shows it, which prints what
 *      corral prints; this process relays SIGINT, SIGTERM and SIGHUP to it and
 *      exits with its code. Declined (NotServed): on to 1, nothing having run;
 *   1. sockets: none with CORRAL_SERVICE=0 (no, off, false) or while shell
 *      completion asks (_CORRAL_COMPLETE...); CORRAL_SERVICE_SOCKET alone if
 *      set; else $XDG_RUNTIME_DIR/io.corral.Run (/run/user/UID without the
 *      variable), then for root /run/io.corral.Run;
 *   2. connect; the peer (SO_PEERCRED) must be this uid or root; the hello:
 *      its version (GetInfo) must be this client's, else in-process, said;
 *   3. send Run: argv exactly as typed, the environment, cwd, umask, and
 *      stdin, stdout, stderr and a control pipe's read end as descriptors;
 *      from here every signal that would end corral is written to the
 *      control pipe as one byte (its number): the service stops the run as
 *      corral stops for that signal;
 *   4. the replies: "accepted" (continues), then the result: warnings,
 *      the --json record (written here: this uid, this cwd; for --json-fd N
 *      to this process's descriptor N, which went with the call and which
 *      the held child closes: the command never has it), the summary line,
 *      the exit code.
 *
 * Failure modes, as client.py's:
 *   - nobody listens at a socket: the next one; none left, or the service
 *     declines the run (NotServed, Busy, a wrong peer, a descriptor that
 *     cannot be sent): the run goes on in-process, nothing having run;
 *   - the service ends (or breaks the protocol) before "accepted": nothing
 *     ran; in-process, with a warning; after "accepted": exit 120 (its
 *     tether stops the run, which this process cannot verify);
 *   - UsageError, SetupError: the one-line message, exit 125;
 *   - --json-fd N with N not open here: no service tried (nothing to pass);
 *     the in-process corral says so, exit 125.
 * "In-process" is execv(CORRAL_INPROCESS, [path, prog, args...]): the
 * Python CLI (client.entry_in_process), which does not try the service again;
 * or, when nobody listened on any socket, [path, --service-absent, prog,
 * args...]: the Python client, which may start the service as a transient
 * unit of the manager first (service/transient.py) and hand it the run.
 *
 * Build: cc -O2 -DCORRAL_INPROCESS='"/usr/lib/corral-systemd/corral-inprocess"'
 *        -o corral corral.c   (packaging/stage for the .deb). A relative
 *        CORRAL_INPROCESS is looked for beside the executable: setup.py
 *        builds it so for pip installs, whose bin/ holds corral-inprocess.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <poll.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef CORRAL_INPROCESS
#error "define CORRAL_INPROCESS: the path of the in-process corral (see the header)"
#endif

#define SOCKET_NAME "io.corral.Run"
#define MAX_MESSAGE (4 << 20) /* varlink/wire.py MAX_MESSAGE */
#define MAX_FDS 8             /* varlink/wire.py MAX_FDS */
#define MAX_DEPTH 64          /* JSON nesting this client follows */

extern char **environ;

static const char *prog = "corral";

/* Byte buffers, the stop signals and the held child: held.c, shared with
 * corral-gate (packaging/gate/gate.c). */
#include "held.c"

static void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

static void buf_fmt(struct buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    buf_need(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Length of the well-formed UTF-8 sequence at s (as Python's strict decoder
 * takes it: no overlongs, no surrogates, nothing past U+10FFFF), 0 if none. */
static size_t utf8_sequence(const unsigned char *s, size_t left) {
    unsigned char c = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (left < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}

/* A JSON string of arbitrary bytes. Bytes that are not UTF-8 become lone
 * surrogates \udcXX, as Python's os.fsdecode (surrogateescape) has them and
 * its JSON encoder writes them: the service decodes them to the same bytes. */
static void buf_json_string(struct buf *b, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    size_t left = strlen(text);
    buf_add(b, "\"", 1);
    while (left) {
        size_t n = utf8_sequence(s, left);
        if (n == 0) {
            buf_fmt(b, "\\udc%02x", s[0]);
            n = 1;
        } else if (s[0] == '"' || s[0] == '\\') {
            buf_add(b, "\\", 1);
            buf_add(b, s, 1);
        } else if (s[0] < 0x20) {
            buf_fmt(b, "\\u%04x", s[0]);
        } else {
            buf_add(b, s, n);
        }
        s += n;
        left -= n;
    }
    buf_add(b, "\"", 1);
}

/* ---- JSON, parsed only as far as the replies need --------------------- */

enum jtype { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT };

struct jvalue {
    enum jtype type;
    int boolean;
    double number;
    char *string; /* J_STRING: NUL-terminated (a NUL inside is cut there) */
    size_t count; /* J_ARRAY, J_OBJECT */
    char **keys;  /* J_OBJECT */
    struct jvalue *items;
};

struct parser {
    const char *p, *end;
    int failed;
};

static void skip_space(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex4(struct parser *ps, unsigned *out) {
    if (ps->end - ps->p < 4)
        return 0;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return 0;
    }
    ps->p += 4;
    *out = v;
    return 1;
}

static void put_utf8(struct buf *b, unsigned cp) {
    unsigned char out[4];
    size_t n;
    if (cp >= 0xDC80 && cp <= 0xDCFF) { /* a surrogate-escaped byte: the byte itself */
        out[0] = (unsigned char)(cp - 0xDC00);
        n = 1;
    } else if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        out[0] = (unsigned char)(0xF0 | cp >> 18);
        out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    buf_add(b, out, n);
}

static char *parse_string(struct parser *ps) {
    struct buf b = {0};
    ps->p++; /* the opening quote */
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20)
            goto bad;
        if (c != '\\') {
            buf_add(&b, ps->p++, 1);
            continue;
        }
        if (++ps->p >= ps->end)
            goto bad;
        char e = *ps->p++;
        unsigned cp;
        switch (e) {
        case '"': case '\\': case '/': buf_add(&b, &e, 1); break;
        case 'b': buf_add(&b, "\b", 1); break;
        case 'f': buf_add(&b, "\f", 1); break;
        case 'n': buf_add(&b, "\n", 1); break;
        case 'r': buf_add(&b, "\r", 1); break;
        case 't': buf_add(&b, "\t", 1); break;
        case 'u':
            if (!hex4(ps, &cp))
                goto bad;
            if (cp >= 0xD800 && cp <= 0xDBFF && ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
                struct parser look = *ps;
                unsigned low;
                look.p += 2;
                if (hex4(&look, &low) && low >= 0xDC00 && low <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                    ps->p = look.p;
                }
            }
            put_utf8(&b, cp);
            break;
        default:
            goto bad;
        }
    }
    if (ps->p >= ps->end)
        goto bad;
    ps->p++; /* the closing quote */
    buf_add(&b, "", 1);
    return b.data;
bad:
    free(b.data);
    ps->failed = 1;
    return NULL;
}

static int parse_value(struct parser *ps, struct jvalue *v, int depth) {
    memset(v, 0, sizeof *v);
    skip_space(ps);
    if (ps->p >= ps->end || depth > MAX_DEPTH)
        return ps->failed = 1, 0;
    char c = *ps->p;
    if (c == '"') {
        v->type = J_STRING;
        v->string = parse_string(ps);
        return !ps->failed;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        v->type = c == '{' ? J_OBJECT : J_ARRAY;
        ps->p++;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return 1;
        }
        for (;;) {
            char *key = NULL;
            if (v->type == J_OBJECT) {
                skip_space(ps);
                if (ps->p >= ps->end || *ps->p != '"' || !(key = parse_string(ps)))
                    return ps->failed = 1, 0;
                skip_space(ps);
                if (ps->p >= ps->end || *ps->p != ':')
                    return free(key), ps->failed = 1, 0;
                ps->p++;
            }
            v->items = realloc(v->items, (v->count + 1) * sizeof *v->items);
            v->keys = realloc(v->keys, (v->count + 1) * sizeof *v->keys);
            if (!v->items || !v->keys) {
                fprintf(stderr, "%s: out of memory\n", prog);
                exit(125);
            }
            v->keys[v->count] = key;
            if (!parse_value(ps, &v->items[v->count++], depth + 1))
                return 0;
            skip_space(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == close) {
                ps->p++;
                return 1;
            }
            return ps->failed = 1, 0;
        }
    }
    if (ps->end - ps->p >= 4 && !memcmp(ps->p, "true", 4)) {
        v->type = J_BOOL, v->boolean = 1, ps->p += 4;
        return 1;
    }
    if (ps->end - ps->p >= 5 && !memcmp(ps->p, "false", 5)) {
        v->type = J_BOOL, ps->p += 5;
        return 1;
    }
    if (ps->end - ps->p >= 4 && !memcmp(ps->p, "null", 4)) {
        v->type = J_NULL, ps->p += 4;
        return 1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char tmp[64];
        size_t n = 0;
        while (ps->p + n < ps->end && n < sizeof tmp - 1 && strchr("+-0123456789.eE", ps->p[n]))
            n++;
        memcpy(tmp, ps->p, n);
        tmp[n] = 0;
        char *stop;
        v->type = J_NUMBER;
        v->number = strtod(tmp, &stop);
        if (stop != tmp + n)
            return ps->failed = 1, 0;
        ps->p += n;
        return 1;
    }
    return ps->failed = 1, 0;
}

static struct jvalue *member(const struct jvalue *object, const char *key) {
    if (!object || object->type != J_OBJECT)
        return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (object->keys[i] && !strcmp(object->keys[i], key))
            return &object->items[i];
    return NULL;
}

static const char *member_string(const struct jvalue *object, const char *key) {
    struct jvalue *v = member(object, key);
    return v && v->type == J_STRING ? v->string : NULL;
}

/* ---- the connection --------------------------------------------------- */

static int control_w = -1;

static void forward_signal(int signum) {
    int saved = errno;
    unsigned char byte = (unsigned char)signum;
    if (write(control_w, &byte, 1) < 0) {
        /* nothing to do: the service is gone, the reply loop reports it */
    }
    errno = saved;
}

/* What each stop signal's action was before forwarding: put back (an
 * inherited SIG_IGN, as under nohup, included) when the run goes in-process. */
static struct sigaction saved_actions[_NSIG];

static void set_stop_signals(const struct sigaction *sa, int restore) {
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++) {
        int s = stop_signals[i];
        sigaction(s, restore ? &saved_actions[s] : sa, restore ? NULL : &saved_actions[s]);
    }
    for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
        sigaction(s, restore ? &saved_actions[s] : sa, restore ? NULL : &saved_actions[s]);
}

static void forward_stop_signals(void) {
    struct sigaction sa = {0};
    sa.sa_handler = forward_signal;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    set_stop_signals(&sa, 0);
}

static void restore_stop_signals(void) { set_stop_signals(NULL, 1); }

/* The run's process as this client forks it; pid 0 when there is none. */
struct held {
    pid_t pid;
    int pidfd, gate; /* gate: the service's end, until it is sent */
    int status, exited;
    long long user_ns, system_ns; /* its CPU and what it waited for, -1: unknown */
};

static int sys_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

static void pidfd_kill(int pidfd) { syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0); }

/* Fork it; the descriptors in close_fds are this process's, not the child's. */
static int fork_held(struct held *h, const int *close_fds, int nclose) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(pair[0]);
        close(pair[1]);
        return -1;
    }
    if (pid == 0) {
        for (int i = 0; i < nclose; i++)
            close(close_fds[i]);
        close(pair[0]);
        held_child(pair[1]);
    }
    close(pair[1]);
    h->pid = pid;
    h->gate = pair[0];
    h->exited = 0;
    h->pidfd = sys_pidfd_open(pid);
    if (h->pidfd < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(h->gate);
        h->pid = 0;
        return -1;
    }
    return 0;
}

/* Its wait status, once it has exited, leaving it a zombie (WNOWAIT); 1 then.
 * Its CPU time too: the raw waitid takes a rusage (glibc's has none), which
 * the kernel fills for a zombie left in place (RUSAGE_BOTH: it and what it
 * waited for, final), as gate.exited_with_usage reads it. */
static int held_exited(struct held *h) {
    if (h->exited)
        return 1;
    siginfo_t info = {0};
    struct rusage usage = {0};
    if (syscall(SYS_waitid, P_PID, (id_t)h->pid, &info, WEXITED | WNOHANG | WNOWAIT, &usage) < 0 || info.si_pid == 0)
        return 0;
    h->user_ns = (long long)usage.ru_utime.tv_sec * 1000000000LL + (long long)usage.ru_utime.tv_usec * 1000LL;
    h->system_ns = (long long)usage.ru_stime.tv_sec * 1000000000LL + (long long)usage.ru_stime.tv_usec * 1000LL;
    if (info.si_code == CLD_EXITED)
        h->status = (info.si_status & 0xFF) << 8;
    else
        h->status = (info.si_status & 0x7F) | (info.si_code == CLD_DUMPED ? 0x80 : 0);
    h->exited = 1;
    return 1;
}

/* Kill it (a no-op once it has exited) and reap it; close its descriptors. */
static void held_discard(struct held *h) {
    if (!h->pid)
        return;
    pidfd_kill(h->pidfd);
    while (waitpid(h->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    close(h->pidfd);
    if (h->gate >= 0)
        close(h->gate);
    h->pid = 0;
}

enum outcome {
    DONE,     /* the run's exit code is in attempt.code */
    ABSENT,   /* nobody listens there: try the next socket */
    DECLINED, /* run it in-process (why in reason; warn: say so) */
};

struct attempt {
    char reason[512];
    int warn;
    int code;
};

static enum outcome decline(struct attempt *a, int warn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->reason, sizeof a->reason, fmt, ap);
    va_end(ap);
    a->warn = warn;
    return DECLINED;
}

static int send_all(int fd, const char *data, size_t len, const int *fds, int nfds) {
    union {
        char space[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct cmsghdr align;
    } control;
    while (len) {
        struct iovec iov = {(void *)data, len};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (nfds) {
            memset(&control, 0, sizeof control);
            msg.msg_control = control.space;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
        }
        ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        nfds = 0; /* the descriptors went with the first byte */
        data += sent;
        len -= (size_t)sent;
    }
    return 0;
}

/* The next NUL-terminated message into *msg (NUL replaced by the end of the
 * string); 1, or 0 at end of file between messages, or -1 with why set.
 * Descriptors that come with it are closed, but for the first nkept ones,
 * into the slots of kept still -1. */
static int receive_keeping(int fd, struct buf *in, struct buf *msg, const char **why, int *kept, size_t nkept) {
    for (;;) {
        char *nul = in->len ? memchr(in->data, 0, in->len) : NULL;
        if (nul) {
            size_t n = (size_t)(nul - in->data);
            msg->len = 0;
            buf_add(msg, in->data, n + 1);
            memmove(in->data, nul + 1, in->len - n - 1);
            in->len -= n + 1;
            return 1;
        }
        if (in->len > MAX_MESSAGE) {
            *why = "a message longer than the protocol's bound";
            return -1;
        }
        buf_need(in, 65536);
        union {
            char space[CMSG_SPACE(sizeof(int) * MAX_FDS)];
            struct cmsghdr align;
        } control;
        struct iovec iov = {in->data + in->len, 65536};
        struct msghdr m = {0};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = control.space;
        m.msg_controllen = sizeof control.space;
        ssize_t got = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            *why = strerror(errno);
            return -1;
        }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                    int got_fd;
                    memcpy(&got_fd, CMSG_DATA(c) + i * sizeof(int), sizeof got_fd);
                    size_t slot = 0;
                    while (slot < nkept && kept[slot] >= 0)
                        slot++;
                    if (slot < nkept)
                        kept[slot] = got_fd;
                    else
                        close(got_fd); /* none expected */
                }
        if (got == 0) {
            if (in->len) {
                *why = "end of file inside a message";
                return -1;
            }
            *why = "the connection closed";
            return 0;
        }
        in->len += (size_t)got;
    }
}

static int receive(int fd, struct buf *in, struct buf *msg, const char **why) {
    return receive_keeping(fd, in, msg, why, NULL, 0);
}

/* The descriptor a command line names with --json-fd (its last one before
 * "--"), as core/record_fd.py's named_in reads it: ASCII digits, 3 to 2^30;
 * -1 if none. Not the parser: the service compares it with what it parsed. */
static int json_fd_named(int argc, char **argv) {
    static const char option[] = "--json-fd";
    int found = -1;
    for (int i = 1; i < argc; i++) {
        const char *value = NULL;
        if (!strcmp(argv[i], "--"))
            break;
        if (!strcmp(argv[i], option) && i + 1 < argc)
            value = argv[i + 1];
        else if (!strncmp(argv[i], option, sizeof option - 1) && argv[i][sizeof option - 1] == '=')
            value = argv[i] + sizeof option;
        else
            continue;
        long n = 0;
        size_t len = strlen(value);
        for (size_t k = 0; k < len && n >= 0; k++)
            n = value[k] >= '0' && value[k] <= '9' && k < 10 ? n * 10 + (value[k] - '0') : -1;
        found = len && n >= 3 && n <= (1L << 30) ? (int)n : -1;
    }
    return found;
}

/* --json PATH written as record_json.write_file writes it: a 0600 temporary
 * file beside it, synced, renamed over it; never over a non-regular file. */
static int write_record(const char *record, const char *path, char *why, size_t whylen) {
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(why, whylen, "%s is not a regular file; not replacing it", path);
        return -1;
    }
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) : 0;
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%.*s/.corral-record-XXXXXX", (int)dirlen, slash ? path : ".") >= (int)sizeof tmp) {
        snprintf(why, whylen, "%s: path too long", path);
        return -1;
    }
    int fd = mkostemp(tmp, O_CLOEXEC); /* mode 0600 */
    if (fd < 0) {
        snprintf(why, whylen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    size_t len = strlen(record), done = 0;
    while (done < len) {
        ssize_t n = write(fd, record + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            goto fail;
        done += (size_t)n;
    }
    if (fsync(fd) < 0)
        goto fail;
    close(fd);
    fd = -1;
    if (rename(tmp, path) < 0)
        goto fail;
    return 0;
fail:
    snprintf(why, whylen, "%s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return -1;
}

/* All of data to fd (waiting while a non-blocking one is full); -1 with errno if it cannot take it. */
static int write_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            struct pollfd p = {fd, POLLOUT, 0};
            poll(&p, 1, -1);
            continue;
        }
        if (n <= 0)
            return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* A call's "program" and "argv" members: this program's name, its arguments exactly as typed. */
static void buf_program_argv(struct buf *out, int argc, char **argv) {
    buf_str(out, "\"program\":");
    buf_json_string(out, prog);
    buf_str(out, ",\"argv\":[");
    for (int i = 1; i < argc; i++) {
        if (i > 1)
            buf_add(out, ",", 1);
        buf_json_string(out, argv[i]);
    }
    buf_add(out, "]", 1);
}

/* What corral prints and writes once the run is over (client.py _finish). */
static int finish(const struct jvalue *parameters) {
    struct jvalue *warnings = member(parameters, "warnings");
    if (warnings && warnings->type == J_ARRAY)
        for (size_t i = 0; i < warnings->count; i++)
            if (warnings->items[i].type == J_STRING)
                fprintf(stderr, "corral: warning: %s\n", warnings->items[i].string);
    const char *record = member_string(parameters, "record"), *path = member_string(parameters, "record_path");
    struct jvalue *fd = member(parameters, "record_fd");
    if (record && fd && fd->type == J_NUMBER) {
        if (write_all((int)fd->number, record, strlen(record)) < 0)
            fprintf(stderr, "%s: cannot write --json record: %s\n", prog, strerror(errno));
    } else if (record && path) {
        char why[PATH_MAX + 128];
        if (!strcmp(path, "-"))
            write_all(1, record, strlen(record));
        else if (write_record(record, path, why, sizeof why) < 0)
            fprintf(stderr, "%s: cannot write --json record: %s\n", prog, why);
    }
    const char *summary = member_string(parameters, "summary");
    if (summary && *summary)
        fprintf(stderr, "%s\n", summary);
    struct jvalue *code = member(parameters, "exit_code");
    return code && code->type == J_NUMBER ? (int)code->number : 120;
}

static void print_json(FILE *f, const struct jvalue *v) {
    switch (v->type) {
    case J_NULL: fputs("null", f); break;
    case J_BOOL: fputs(v->boolean ? "true" : "false", f); break;
    case J_NUMBER: fprintf(f, "%g", v->number); break;
    case J_STRING: fprintf(f, "\"%s\"", v->string); break;
    case J_ARRAY:
    case J_OBJECT:
        fputc(v->type == J_ARRAY ? '[' : '{', f);
        for (size_t i = 0; i < v->count; i++) {
            if (i)
                fputs(", ", f);
            if (v->keys[i])
                fprintf(f, "\"%s\": ", v->keys[i]);
            print_json(f, &v->items[i]);
        }
        fputc(v->type == J_ARRAY ? ']' : '}', f);
        break;
    }
}

static char *json_text(const struct jvalue *v) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return strdup("{}");
    if (v)
        print_json(f, v);
    else
        fputs("{}", f);
    fclose(f);
    return text;
}

/* Wait for the next reply while watching the held child: its wait status
 * goes to the service (exit_w) as soon as it has exited. As receive(). */
static int next_reply(int sock, struct buf *in, struct buf *msg, const char **why, struct held *h, int exit_w) {
    while (!(in->len && memchr(in->data, 0, in->len))) {
        struct pollfd p[2] = {{sock, POLLIN, 0}, {h->exited ? -1 : h->pidfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue; /* a forwarded signal */
            *why = strerror(errno);
            return -1;
        }
        if (p[1].revents && held_exited(h)) {
            char line[80];
            int n = snprintf(line, sizeof line, "%d %lld %lld\n", h->status, h->user_ns, h->system_ns);
            if (write(exit_w, line, (size_t)n) < 0) {
                /* the service is gone: the connection says so */
            }
        }
        if (p[0].revents)
            break;
    }
    return receive(sock, in, msg, why);
}

/* The hello, as chg's, before anything else: the service says its version
 * (org.varlink.service.GetInfo) and a service of another version -- one left
 * running from before an upgrade -- never runs this client's command line: 0,
 * or -1 with the attempt declined (said: the user should restart it). */
static int hello(int sock, struct buf *in, struct buf *msg, const char *path, struct attempt *a) {
    static const char getinfo[] = "{\"method\":\"org.varlink.service.GetInfo\"}"; /* sizeof: its NUL too */
    const char *why = NULL;
    if (send_all(sock, getinfo, sizeof getinfo, NULL, 0) < 0) {
        decline(a, 0, "the hello: %s", strerror(errno));
        return -1;
    }
    if (receive(sock, in, msg, &why) != 1) {
        decline(a, 1, "the corral service at %s did not answer its hello (%s)", path, why ? why : "?");
        return -1;
    }
    struct jvalue reply = {0};
    struct parser ps = {msg->data, msg->data + (msg->len ? msg->len - 1 : 0), 0};
    const char *version = NULL;
    if (parse_value(&ps, &reply, 0) && (skip_space(&ps), ps.p == ps.end) && reply.type == J_OBJECT)
        version = member_string(member(&reply, "parameters"), "version");
    if (!version || strcmp(version, CORRAL_VERSION)) {
        decline(a, 1,
                "the corral service at %s is version %s, this corral %s: the run goes on in-process "
                "(restart the service to serve it)",
                path, version ? version : "unknown", CORRAL_VERSION);
        return -1;
    }
    return 0;
}

static enum outcome run_via_service(const char *path, int argc, char **argv, int record_fd, struct attempt *a) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return decline(a, 0, "%s: the socket path is too long", path), ABSENT;
    strcpy(addr.sun_path, path);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return decline(a, 0, "socket: %s", strerror(errno));
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) {
        decline(a, 0, "%s: %s", path, strerror(errno));
        close(sock);
        return ABSENT;
    }
    struct ucred peer;
    socklen_t peerlen = sizeof peer;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &peerlen) < 0 || (peer.uid != 0 && peer.uid != getuid())) {
        close(sock);
        return decline(a, 0, "the socket is not served by this user or root");
    }
    struct buf in = {0}, msg = {0};
    if (hello(sock, &in, &msg, path, a) != 0) {
        free(in.data);
        free(msg.data);
        close(sock);
        return DECLINED;
    }
    int control[2], exits[2];
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        close(sock);
        return decline(a, 0, "getcwd: %s", strerror(errno));
    }
    if (pipe2(control, O_CLOEXEC) < 0) {
        close(sock);
        return decline(a, 0, "pipe: %s", strerror(errno));
    }
    if (pipe2(exits, O_CLOEXEC) < 0) {
        close(control[0]);
        close(control[1]);
        close(sock);
        return decline(a, 0, "pipe: %s", strerror(errno));
    }
    /* The command's process: this process's child, held at its gate until the
     * service has made the run's scope around it (kernel/gate.py). */
    struct held h = {0};
    int mine[5] = {sock, control[0], control[1], exits[0], exits[1]};
    /* The held child closes these: ours, and --json-fd's (the command never has it). */
    int not_the_childs[6] = {sock, control[0], control[1], exits[0], exits[1], record_fd};
    /* A child subreaper: a process of the run whose parent dies becomes this
     * process's child, wherever it moved itself; the service finds it so. */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    if (fork_held(&h, not_the_childs, record_fd >= 0 ? 6 : 5) < 0) {
        int err = errno;
        for (int i = 0; i < 5; i++)
            close(mine[i]);
        return decline(a, 0, "fork: %s", strerror(err));
    }
    /* After the fork (the service reads the child's /proc files): the command,
     * which runs as this uid, cannot ptrace this process or open its pipes. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    mode_t mask = umask(022);
    umask(mask);

    struct buf out = {0};
    buf_str(&out, "{\"method\":\"io.corral.Run.Run\",\"parameters\":{");
    buf_program_argv(&out, argc, argv);
    buf_str(&out, ",\"environment\":[");
    int first = 1;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || eq == *e) /* not NAME=VALUE: os.environ leaves it out too */
            continue;
        if (!first)
            buf_add(&out, ",", 1);
        first = 0;
        buf_json_string(&out, *e);
    }
    buf_str(&out, "],\"cwd\":");
    buf_json_string(&out, cwd);
    buf_fmt(&out,
            ",\"umask\":%u,\"stdin\":0,\"stdout\":1,\"stderr\":2,\"control\":3,\"process\":4,\"gate\":5,\"exit\":6",
            (unsigned)mask);
    if (record_fd >= 0)
        buf_fmt(&out, ",\"json_fd\":%d,\"record\":7", record_fd);
    buf_str(&out, "},\"more\":true}");
    buf_add(&out, "", 1); /* the message's NUL */

    /* From here a stop signal is the run's: forwarded as a byte. */
    control_w = control[1];
    forward_stop_signals();
    int fds[8] = {0, 1, 2, control[0], h.pidfd, h.gate, exits[0], record_fd};
    int sent = send_all(sock, out.data, out.len, fds, record_fd >= 0 ? 8 : 7);
    int send_errno = errno;
    free(out.data);
    close(control[0]);
    close(exits[0]);
    close(h.gate);
    h.gate = -1;
    if (sent < 0) { /* the service gone: all handled in-process */
        restore_stop_signals();
        held_discard(&h);
        close(control[1]);
        close(exits[1]);
        close(sock);
        return decline(a, 0, "sending the run: %s", strerror(send_errno));
    }

    int accepted = 0;
    for (;;) {
        const char *why = NULL;
        int got = next_reply(sock, &in, &msg, &why, &h, exits[1]);
        struct jvalue reply = {0};
        struct parser ps = {msg.data, msg.data + (msg.len ? msg.len - 1 : 0), 0};
        if (got == 1) {
            if (!parse_value(&ps, &reply, 0) || (skip_space(&ps), ps.p != ps.end) || reply.type != J_OBJECT) {
                got = -1;
                why = "a message that is not a JSON object";
            }
        }
        if (got <= 0) {
            held_discard(&h); /* never released, or its scope is stopped by the service's tether */
            if (!accepted) {
                restore_stop_signals();
                close(control[1]);
                close(exits[1]);
                close(sock);
                return decline(a, 1, "the corral service ended before it took the run (%s)", why);
            }
            fprintf(stderr,
                    "%s: the corral service ended during the run (%s): its tether stops the run, "
                    "which this process cannot verify\n",
                    prog, why);
            a->code = 120;
            return DONE;
        }
        const struct jvalue *parameters = member(&reply, "parameters");
        const char *error = member_string(&reply, "error");
        if (member(&reply, "error")) {
            held_discard(&h); /* still at its gate, or exited: reaped */
            const char *name = error ? error : "(no name)";
            if (!strcmp(name, "io.corral.Run.UsageError") || !strcmp(name, "io.corral.Run.SetupError")) {
                const char *message = member_string(parameters, "message");
                fprintf(stderr, "%s: %s\n", prog, message ? message : name);
                a->code = 125;
                return DONE;
            }
            char *text = json_text(parameters);
            if (accepted && strcmp(name, "io.corral.Run.NotServed")) { /* NotServed: nothing ran, even after accepted */
                fprintf(stderr, "%s: the corral service failed during the run (%s %s)\n", prog, name, text);
                a->code = 120;
                return DONE;
            }
            restore_stop_signals();
            close(control[1]);
            close(exits[1]);
            close(sock);
            decline(a, !strcmp(name, "io.corral.Run.InternalError"), "%s %s", name, text);
            free(text);
            return DECLINED;
        }
        struct jvalue *continues = member(&reply, "continues");
        if (continues && continues->type == J_BOOL && continues->boolean) {
            accepted = 1;
            continue;
        }
        held_discard(&h); /* exited (a zombie until now), or never started: reaped */
        a->code = finish(parameters);
        return DONE;
    }
}

/* ---- a session's holder as a --background run's front ------------------ */

/* The session a --background command line names (--session ID, --session=ID,
 * else CORRAL_SESSION), if it is an id (1-64 lowercase hex digits: a name is
 * looked up by the Python side); NULL when the line has no --background
 * before "--". A hint, not the parser: the holder reads the line as corral
 * does and declines what is not a background run of its session. */
static const char *background_session(int argc, char **argv) {
    int background = 0;
    const char *session = getenv("CORRAL_SESSION");
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
        if (!strcmp(argv[i], "--background"))
            background = 1;
        else if (!strcmp(argv[i], "--session") && i + 1 < argc)
            session = argv[++i];
        else if (!strncmp(argv[i], "--session=", 10))
            session = argv[i] + 10;
    }
    if (!background || !session)
        return NULL;
    size_t n = strspn(session, "0123456789abcdef");
    return n > 0 && n <= 64 && !session[n] ? session : NULL;
}

static int front_pidfd = -1;

static void relay_signal(int signum) {
    int saved = errno;
    syscall(SYS_pidfd_send_signal, front_pidfd, signum, NULL, 0);
    errno = saved;
}

/* The signals corral's own front stops a starting background run on (core/background.py). */
static const int front_signals[] = {SIGINT, SIGTERM, SIGHUP};

/* Ask the session's holder (its abstract address, served by this uid alone)
 * to be this --background command line's front: it reads the line as corral
 * does and forks its front, made this process's context (the kernel's view of
 * it: environment, cwd, umask, rlimits...) with this process's stdin, stdout
 * and stderr, which prints what corral prints. This process relays the stop
 * signals corral's front acts on (SIGINT, SIGTERM, SIGHUP) to it through the
 * pidfd the holder sends, and exits with its exit code. Declined (NotServed,
 * nobody at the address, another version): nothing ran, the Python side
 * goes on; UsageError: the one line, 125. */
static enum outcome front_via_holder(const char *session, int argc, char **argv, struct attempt *a) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int len = snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "corral-session/%u/%s", (unsigned)geteuid(), session);
    if (len < 0 || (size_t)len >= sizeof addr.sun_path - 1)
        return decline(a, 0, "the session's address is too long");
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return decline(a, 0, "socket: %s", strerror(errno));
    if (connect(sock, (struct sockaddr *)&addr, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)) < 0) {
        close(sock);
        return decline(a, 0, "session %s's holder: %s", session, strerror(errno));
    }
    struct ucred peer;
    socklen_t peerlen = sizeof peer;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &peerlen) < 0 || peer.uid != geteuid()) {
        close(sock);
        return decline(a, 0, "session %s's address is not this user's", session);
    }
    struct buf out = {0};
    buf_str(&out, "{\"method\":\"io.corral.SessionHolder.Front\",\"parameters\":{\"version\":");
    buf_json_string(&out, CORRAL_VERSION);
    buf_add(&out, ",", 1);
    buf_program_argv(&out, argc, argv);
    buf_str(&out, "}}");
    buf_add(&out, "", 1);
    /* From the call on, a stop signal is the front's: held back until its pidfd is
     * here, then relayed (a decline puts the mask back: corral's own front takes it). */
    sigset_t stops, before;
    sigemptyset(&stops);
    for (size_t i = 0; i < sizeof front_signals / sizeof *front_signals; i++)
        sigaddset(&stops, front_signals[i]);
    sigprocmask(SIG_BLOCK, &stops, &before);
    int stdio[3] = {0, 1, 2};
    int sent = send_all(sock, out.data, out.len, stdio, 3);
    int send_errno = errno;
    free(out.data);
    if (sent < 0) {
        sigprocmask(SIG_SETMASK, &before, NULL);
        close(sock);
        return decline(a, 0, "session %s's holder: %s", session, strerror(send_errno));
    }
    struct buf in = {0}, msg = {0};
    int started = 0;
    for (;;) {
        const char *why = NULL;
        /* The answer brings the front's pidfd and its gate: the front starts only once
         * this process, having read the answer, lets it (a gate closed unreleased, on
         * any other way out of here, makes it exit without a run). */
        int fds[2] = {-1, -1};
        int got = receive_keeping(sock, &in, &msg, &why, fds, started ? 0 : 2);
        int kept = fds[0], gate = fds[1];
        struct jvalue reply = {0};
        struct parser ps = {msg.data, msg.data + (msg.len ? msg.len - 1 : 0), 0};
        if (got == 1 && (!parse_value(&ps, &reply, 0) || (skip_space(&ps), ps.p != ps.end) || reply.type != J_OBJECT)) {
            got = -1;
            why = "a message that is not a JSON object";
        }
        const struct jvalue *parameters = got == 1 ? member(&reply, "parameters") : NULL;
        const char *error = got == 1 ? member_string(&reply, "error") : NULL;
        if (got <= 0 || (started && (error || member(&reply, "error")))) {
            if (kept >= 0)
                close(kept);
            if (gate >= 0)
                close(gate);
            if (!started) {
                sigprocmask(SIG_SETMASK, &before, NULL);
                close(sock);
                return decline(a, 1, "session %s's holder ended before it took the run (%s)", session, why ? why : "?");
            }
            /* Its front goes on (the holder's child), never started again here: once it
             * has ended, what it said is on stderr, and its exit code is not known. */
            struct pollfd p = {front_pidfd, POLLIN, 0};
            while (poll(&p, 1, -1) < 0 && errno == EINTR)
                ;
            fprintf(stderr, "%s: session %s's holder did not tell the front's exit code (%s)\n", prog, session,
                    got <= 0 ? (why ? why : "?") : (error ? error : "an error"));
            a->code = 120;
            return DONE;
        }
        if (member(&reply, "error")) {
            if (kept >= 0)
                close(kept);
            if (gate >= 0)
                close(gate);
            const char *text = member_string(parameters, "why");
            sigprocmask(SIG_SETMASK, &before, NULL);
            close(sock);
            if (error && !strcmp(error, "io.corral.SessionHolder.UsageError")) {
                fprintf(stderr, "%s: %s\n", prog, text ? text : error);
                a->code = 125;
                return DONE;
            }
            return decline(a, !error || strcmp(error, "io.corral.SessionHolder.NotServed"), "session %s's holder: %s (%s)",
                           session, error ? error : "an error", text ? text : "");
        }
        if (!started) {
            struct jvalue *continues = member(&reply, "continues");
            if (kept < 0 || gate < 0 || !continues || continues->type != J_BOOL || !continues->boolean) {
                /* A reply that is not the protocol's: whether a front started is not known,
                 * so nothing starts here either (a second front would start a second run);
                 * a front whose pidfd came is waited for, as when the holder ends early. */
                if (gate >= 0)
                    close(gate);
                sigprocmask(SIG_SETMASK, &before, NULL);
                if (kept >= 0) {
                    struct pollfd p = {kept, POLLIN, 0};
                    while (poll(&p, 1, -1) < 0 && errno == EINTR)
                        ;
                    close(kept);
                }
                fprintf(stderr, "%s: session %s's holder answered with no front: whether the run started is not known\n",
                        prog, session);
                a->code = 120;
                return DONE;
            }
            started = 1;
            front_pidfd = kept;
            struct sigaction sa = {0};
            sa.sa_handler = relay_signal;
            sa.sa_flags = SA_RESTART;
            sigfillset(&sa.sa_mask);
            for (size_t i = 0; i < sizeof front_signals / sizeof *front_signals; i++)
                sigaction(front_signals[i], &sa, NULL);
            sigprocmask(SIG_SETMASK, &before, NULL); /* one held back meanwhile goes to the front now */
            /* The answer is read: the front may go on. One gone already (its gate's
             * other end closed) is told by its pidfd, its exit code by the holder. */
            ssize_t released = write(gate, "1", 1);
            (void)released;
            close(gate);
            continue;
        }
        struct jvalue *code = member(parameters, "exit_code");
        a->code = code && code->type == J_NUMBER ? (int)code->number : 120;
        return DONE;
    }
}

static int service_off(void) {
    const char *v = getenv("CORRAL_SERVICE");
    return v && (!strcasecmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "off") || !strcasecmp(v, "false"));
}

static int completing(void) {
    char var[64];
    size_t n = 0;
    var[n++] = '_';
    for (const char *p = prog; *p && n < sizeof var - 10; p++)
        var[n++] = *p == '-' ? '_' : (*p >= 'a' && *p <= 'z' ? (char)(*p - 32) : *p);
    strcpy(var + n, "_COMPLETE");
    return getenv(var) != NULL;
}

/* A closed 0, 1 or 2 gets /dev/null before anything here opens a descriptor,
 * which would take its number and be the command's stdio (the socket to the
 * service as its stdout, say). */
static void open_closed_stdio(void) {
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", fd ? O_WRONLY : O_RDONLY) != fd)
            _exit(125);
}

int main(int argc, char **argv) {
    open_closed_stdio();
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    prog = !strcmp(base, "corral-enforced") ? "corral-enforced" : "corral";
    /* As Python: a closed stdout is EPIPE here, not death. Put back before exec. */
    struct sigaction ignore = {0}, inherited;
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &inherited);

    char paths[2][PATH_MAX];
    int npaths = 0;
    /* Before this process opens anything that could take its number. Not open:
     * nothing to pass, and the in-process corral says so (125). */
    int record_fd = json_fd_named(argc, argv);
    int nothing_to_pass = record_fd >= 0 && fcntl(record_fd, F_GETFD) < 0;
    if (!service_off() && !completing() && !nothing_to_pass) {
        const char *only = getenv("CORRAL_SERVICE_SOCKET");
        if (only && *only) {
            snprintf(paths[npaths++], PATH_MAX, "%s", only);
        } else {
            const char *runtime = getenv("XDG_RUNTIME_DIR");
            if (runtime && *runtime)
                snprintf(paths[npaths++], PATH_MAX, "%s/" SOCKET_NAME, runtime);
            else
                snprintf(paths[npaths++], PATH_MAX, "/run/user/%u/" SOCKET_NAME, (unsigned)getuid());
            if (geteuid() == 0)
                snprintf(paths[npaths++], PATH_MAX, "/run/" SOCKET_NAME);
        }
    }
    /* A --background run of a session: its front is the session's holder's fork
     * (no interpreter starts here), where the holder takes it. */
    const char *session = background_session(argc, argv);
    if (session && !service_off() && !completing() && record_fd < 0) {
        struct attempt a = {{0}, 0, 0};
        if (front_via_holder(session, argc, argv, &a) == DONE)
            return a.code;
        if (a.warn || getenv("CORRAL_SERVICE_DEBUG"))
            fprintf(stderr, "%s: warning: the session's holder is not this run's front: %s\n", prog, a.reason);
    }
    int absent = npaths > 0; /* nobody listened anywhere: the Python side may start the service */
    for (int i = 0; i < npaths; i++) {
        struct attempt a = {{0}, 0, 0};
        enum outcome o = run_via_service(paths[i], argc, argv, record_fd, &a);
        if (o == DONE)
            return a.code;
        if (a.warn || getenv("CORRAL_SERVICE_DEBUG"))
            fprintf(stderr, "%s: warning: running the command here, not in the corral service: %s\n", prog, a.reason);
        if (o == DECLINED) {
            absent = 0;
            break; /* a service answered (or died): the run is not another one's to take */
        }
    }

    /* A relative CORRAL_INPROCESS (a pip install: the scripts' directory is
     * not known when this is built) is beside this executable. */
    char in_process[PATH_MAX] = CORRAL_INPROCESS;
    if (in_process[0] != '/') {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        char *slash = n > 0 ? (self[n] = 0, strrchr(self, '/')) : NULL;
        if (!slash || snprintf(in_process, sizeof in_process, "%.*s/%s", (int)(slash - self), self, CORRAL_INPROCESS) >=
                          (int)sizeof in_process) {
            fprintf(stderr, "%s: cannot find %s beside this program\n", prog, CORRAL_INPROCESS);
            return 125;
        }
    }
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args)
        return 125;
    int n = 0;
    args[n++] = in_process;
    /* Starting the service as a transient unit is the Python side's
     * (service/transient.py, once per manager): told that nobody listened. */
    if (absent)
        args[n++] = "--service-absent";
    args[n++] = (char *)prog;
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    sigaction(SIGPIPE, &inherited, NULL);
    execv(in_process, args);
    fprintf(stderr, "%s: cannot run the in-process corral %s: %s\n", prog, in_process, strerror(errno));
    return 125;
}
