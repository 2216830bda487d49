/* corral-tether: the waiting half of a run's tether, as a small program, so
 * that a waiting run is one Python process (corral) and this one, not two
 * copies of the interpreter. corral starts it (posix_spawn, a session of its
 * own) from corral_systemd/engines/tether.py and fallback_tether.py.
 *
 *   corral-tether CORRAL_PID
 *       the systemd tether: lives exactly as long as process CORRAL_PID, its
 *       parent (watched through a pidfd, never PR_SET_PDEATHSIG, which
 *       follows the forking thread); corral moves it into the tether scope
 *       its run units are bound to, whose end stops them.
 *
 *   corral-tether CORRAL_PID LATE_MS RESUME_MS STOP_PROGRAM [ARG...]
 *       the fallback and cgroup tiers' tether: fd 3 is the read end of the
 *       "done" pipe only corral writes to. "d": the run ended under corral,
 *       exit 0. End of file (corral died, however): exec STOP_PROGRAM ARG...
 *       dead. LATE_MS ("-": no deadline) after its start corral must have
 *       said something: if not, corral is late (stopped by what it runs, or
 *       hung): SIGCONT it through its pidfd and, if it has still said
 *       nothing RESUME_MS later, exec STOP_PROGRAM ARG... late.
 *
 * The stop itself stays Python (corral_systemd/engines/tether_stop.py: the
 * one stop sequence, common/stopping.py): exec'd with fd 3 the done pipe and
 * fd 4 corral's pidfd (absent where the kernel gave none), the same layout as
 * the Python tether's.
 *
 * Guarantees: not dumpable (the run's commands are of its uid: none may
 * ptrace it or open its descriptors; the stop program says so again after
 * its exec), a session of its own (the spawn's), terminal signals ignored
 * (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGPIPE; kept across the exec),
 * no signal blocked, stdio on /dev/null and no descriptor but the done pipe
 * and corral's pidfd. Waiting is a blocked poll: no tick.
 * Failure modes: bad arguments, exit 125; the stop program cannot be exec'd,
 * exit 127 (the run is then left as corral left it, for corralctl stop); no
 * pidfd (Linux < 5.3): the systemd tether ends at once (its units stop: never
 * a run left unbound), the fallback one waits on the pipe alone (no SIGCONT).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DONE_FD 3
#define CORRAL_FD 4

static const int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGPIPE};

/* Every descriptor from `lowest` up closed: what corral's spawn let through
 * (the caller's descriptors corral keeps for the command) is not ours. */
static void close_from(int lowest)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, lowest, ~0U, 0) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536)
        max = 65536;
    for (int fd = lowest; fd < max; fd++)
        close(fd);
}

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Did corral write to or close the done pipe within `ms` (-1: however long)?
 * A descriptor poll refuses counts as said: the read then finds out. */
static int said_within(long long ms)
{
    long long give_up = ms < 0 ? -1 : now_ms() + ms;
    for (;;) {
        int left = -1;
        if (ms >= 0) {
            long long rest = give_up - now_ms();
            if (rest <= 0)
                return 0;
            left = rest > INT_MAX ? INT_MAX : (int)rest;
        }
        struct pollfd p = {.fd = DONE_FD, .events = POLLIN};
        int n = poll(&p, 1, left);
        if (n > 0 || (n < 0 && errno != EINTR))
            return 1;
    }
}

/* STOP_PROGRAM ARG... PHASE, in this process (its pid is the tether's). */
static void exec_stop(char **stop, int count, const char *phase)
{
    char **argv = calloc((size_t)count + 2, sizeof *argv);
    if (argv != NULL) {
        memcpy(argv, stop, (size_t)count * sizeof *argv);
        argv[count] = (char *)phase;
        execv(argv[0], argv);
    }
    _exit(127);
}

static long long milliseconds(const char *text)
{
    if (strcmp(text, "-") == 0)
        return -1;
    char *end;
    errno = 0;
    long long ms = strtoll(text, &end, 10);
    if (errno || end == text || *end || ms < 0)
        _exit(125);
    return ms;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc < 5)
        return 125;
    char *end;
    long parent = strtol(argv[1], &end, 10);
    if (end == argv[1] || *end || parent <= 1)
        return 125;
    int fallback = argc >= 5;
    long long late = fallback ? milliseconds(argv[2]) : -1, resume = fallback ? milliseconds(argv[3]) : -1;

    /* Its exec made it dumpable again: the run's commands are of its uid, and
     * none may ptrace it or open its descriptors (corral's pidfd among them). */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        signal(ignored[i], SIG_IGN);
    close_from(fallback ? DONE_FD + 1 : DONE_FD);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        for (int fd = 0; fd <= 2; fd++)
            dup2(null, fd);
        if (null > 2)
            close(null);
    }

    /* corral's pidfd, then a look that its pid was still corral's when opened. */
    int corral = (int)syscall(SYS_pidfd_open, (pid_t)parent, 0);
    if (getppid() != (pid_t)parent) {
        if (!fallback)
            return 0; /* corral is gone already: so is the tether */
        if (corral >= 0)
            close(corral); /* not corral's: the done pipe's end of file says the rest */
        corral = -1;
    }
    /* At CORRAL_FD without close-on-exec (pidfd_open sets it): the stop program's. */
    if (corral >= 0 && corral != CORRAL_FD) {
        dup2(corral, CORRAL_FD);
        close(corral);
    } else if (corral == CORRAL_FD) {
        fcntl(CORRAL_FD, F_SETFD, 0);
    }

    if (!fallback) {
        struct pollfd p = {.fd = CORRAL_FD, .events = POLLIN};
        while (corral >= 0 && poll(&p, 1, -1) <= 0 && errno == EINTR)
            ;
        return 0;
    }

    if (late >= 0 && !said_within(late)) {
        if (corral >= 0)
            syscall(SYS_pidfd_send_signal, CORRAL_FD, SIGCONT, NULL, 0);
        if (!said_within(resume))
            exec_stop(argv + 4, argc - 4, "late");
    }
    said_within(-1);
    char said = 0;
    ssize_t n;
    while ((n = read(DONE_FD, &said, 1)) < 0 && errno == EINTR)
        ;
    if (n == 1 && said == 'd')
        return 0;
    exec_stop(argv + 4, argc - 4, "dead"); /* end of file: corral is gone */
    return 127;
}
