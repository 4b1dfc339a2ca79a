/* The launch probe's user side: attaches launchprobe.bpf.c's programs to the driver API's
 * entry points in one library file and, every INTERVAL_MS, prints what changed per process;
 * between ticks it prints each wake (a launch after WAKE_GAP_US without a launch or a wait's
 * return) as soon as the kernel sends it.
 *
 * usage: gpuguard-launchprobe LIBRARY [INTERVAL_MS [WAKE_GAP_US]]
 * stdout, one record a line (docs/interfaces.md, "launch probe"):
 *   ready <launch symbols> <copy symbols> <wait symbols> <wakes|-> usr1   once, when attached
 *   t <now_ns>                                             a tick (CLOCK_MONOTONIC)
 *   p <tgid> <launches> <copies> <first_ns> <last_ns> <period_ns> <waits> <wait_ns>
 *     <wait_start_ns> <wait_end_ns> <inputs> <input_ns> <input_after_ns>
 *                                                          a process that changed
 *   x <tgid>                                               a process that is gone
 *   .                                                      end of the tick
 *   w <tgid> <launch_ns>                                   a wake, between ticks
 *   q <tgid> <return_ns>                                   a wait's return after a launch,
 *                                                          between ticks (where wakes are)
 * WAKE_GAP_US 0 (the default) sends no wakes, nor does a kernel without the BPF ring buffer
 * (before Linux 5.8): ready's fifth field says whether wakes are sent. SIGUSR1 asks for a
 * tick now (the reader times a busy period's end); ready's sixth field, "usr1", says so.
 * Exit status: 2 usage, 3 the BPF programs cannot be loaded (no CAP_BPF/CAP_PERFMON),
 * 4 the library cannot be probed (missing, or no launch entry point in it). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "launchprobe.skel.h"

struct proc_stats {
    unsigned long long launches, copies, first_ns, last_ns, period_ns, waits, wait_ns,
        wait_start_ns, wait_end_ns;
    long long depth;
    unsigned long long inputs, input_ns, input_after_ns, stage, burst_end_ns, quiet_ns;
};

static const char *launch_syms[] = {
    "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch",
    "cuGraphLaunch_ptsz", NULL};
static const char *copy_in_syms[] = {"cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz", NULL};
static const char *copy_out_syms[] = {"cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz", NULL};
static const char *copy_syms[] = {"cuMemcpyAsync", "cuMemcpyAsync_ptsz", NULL};
static const char *wait_syms[] = {
    "cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuEventSynchronize",
    "cuCtxSynchronize", "cuStreamQuery", "cuStreamQuery_ptsz", "cuEventQuery", NULL};

#define SLOTS 16384 /* twice the map's entries */
static struct { unsigned tgid; struct proc_stats s; } seen[SLOTS];

static int slot_of(unsigned tgid) {
    unsigned i = (tgid * 2654435761u) % SLOTS;
    while (seen[i].tgid && seen[i].tgid != tgid)
        i = (i + 1) % SLOTS;
    return (int)i;
}

static void forget(unsigned tgid) {
    /* backward-shift deletion keeps the probe chains whole */
    int i = slot_of(tgid);
    if (!seen[i].tgid)
        return;
    seen[i].tgid = 0;
    for (int j = (i + 1) % SLOTS; seen[j].tgid; j = (j + 1) % SLOTS) {
        unsigned t = seen[j].tgid;
        seen[j].tgid = 0;
        int k = slot_of(t);
        seen[k].tgid = t;
        seen[k].s = seen[j].s;
    }
}

struct wake {
    unsigned tgid, kind; /* 0 a launch after a quiet, 1 a wait's return after a launch */
    unsigned long long ns;
};

static int print_wake(void *ctx, void *data, size_t size) {
    const struct wake *w = data;
    if (size < sizeof *w)
        return 0;
    printf("%c %u %llu\n", w->kind ? 'q' : 'w', w->tgid, w->ns);
    *(int *)ctx = 1;
    return 0;
}

static unsigned long long now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (unsigned long long)now.tv_sec * 1000000000ull + now.tv_nsec;
}

/* the BPF object with the wakes (on_launch_pushed and the ring buffer) or without */
static struct launchprobe *load(long wake_gap_us, int push) {
    struct launchprobe *skel = launchprobe__open();
    if (!skel)
        return NULL;
    skel->rodata->wake_gap_ns = (unsigned long long)wake_gap_us * 1000ull;
    bpf_program__set_autoload(push ? skel->progs.on_launch : skel->progs.on_launch_pushed, 0);
    bpf_program__set_autoload(
        push ? skel->progs.on_wait_return : skel->progs.on_wait_return_pushed, 0);
    bpf_map__set_autocreate(skel->maps.wakes, push);
    if (launchprobe__load(skel) != 0) {
        int err = errno;
        launchprobe__destroy(skel);
        errno = err;
        return NULL;
    }
    return skel;
}

static int silent(enum libbpf_print_level level, const char *fmt, va_list args) {
    return level == LIBBPF_WARN ? vfprintf(stderr, fmt, args) : 0;
}

static int attach(struct bpf_program *prog, const char *lib, const char **syms, int ret,
                  char *names, size_t size) {
    int n = 0;
    for (; *syms; syms++) {
        LIBBPF_OPTS(bpf_uprobe_opts, opts, .func_name = *syms, .retprobe = ret);
        struct bpf_link *link = bpf_program__attach_uprobe_opts(prog, -1, lib, 0, &opts);
        if (!link)
            continue; /* not in this library (another driver version) */
        n++;
        if (!ret) {
            size_t used = strlen(names);
            snprintf(names + used, size - used, "%s%s", used ? "," : "", *syms);
        }
    }
    return n;
}

/* set by SIGUSR1: tick now instead of at the interval */
static volatile sig_atomic_t tick_asked;

static void ask_tick(int sig) {
    (void)sig;
    tick_asked = 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s LIBRARY [INTERVAL_MS [WAKE_GAP_US]]\n", argv[0]);
        return 2;
    }
    const char *lib = argv[1];
    long interval_ms = argc >= 3 ? strtol(argv[2], NULL, 10) : 10;
    if (interval_ms < 1 || interval_ms > 1000) {
        fprintf(stderr, "INTERVAL_MS must be 1..1000, got %s\n", argv[2]);
        return 2;
    }
    long wake_gap_us = argc == 4 ? strtol(argv[3], NULL, 10) : 0;
    if (wake_gap_us < 0 || wake_gap_us > 60000000) {
        fprintf(stderr, "WAKE_GAP_US must be 0..60000000, got %s\n", argv[3]);
        return 2;
    }
    if (access(lib, R_OK) != 0) {
        fprintf(stderr, "cannot read %s: %s\n", lib, strerror(errno));
        return 4;
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* the exporter that started it is gone */
    libbpf_set_print(silent);
    int push = wake_gap_us > 0;
    struct launchprobe *skel = load(wake_gap_us, push);
    if (!skel && push && (skel = load(0, 0)) != NULL)
        push = 0; /* no BPF ring buffer (Linux before 5.8): busy edges at the ticks */
    if (!skel) {
        fprintf(stderr, "cannot load the BPF programs: %s\n", strerror(errno));
        return 3;
    }
    int woke = 0;
    struct ring_buffer *wakes = NULL;
    if (push) {
        wakes = ring_buffer__new(bpf_map__fd(skel->maps.wakes), print_wake, &woke, NULL);
        if (!wakes) {
            fprintf(stderr, "cannot read the wakes ring buffer: %s\n", strerror(errno));
            return 3;
        }
    }
    struct bpf_program *on_launch = push ? skel->progs.on_launch_pushed : skel->progs.on_launch;
    struct bpf_program *on_return =
        push ? skel->progs.on_wait_return_pushed : skel->progs.on_wait_return;
    char launches[1024] = "", copies[1024] = "", waits[1024] = "", ignored[1024] = "";
    if (!attach(on_launch, lib, launch_syms, 0, launches, sizeof launches)) {
        fprintf(stderr, "no launch entry point of the CUDA driver API in %s\n", lib);
        return 4;
    }
    attach(skel->progs.on_copy_in, lib, copy_in_syms, 0, copies, sizeof copies);
    attach(skel->progs.on_copy_out, lib, copy_out_syms, 0, copies, sizeof copies);
    attach(skel->progs.on_copy, lib, copy_syms, 0, copies, sizeof copies);
    attach(skel->progs.on_wait, lib, wait_syms, 0, waits, sizeof waits);
    attach(on_return, lib, wait_syms, 1, ignored, sizeof ignored);
    /* no SA_RESTART: the signal ends the wait for wakes (or the sleep) at once */
    struct sigaction on_usr1 = {.sa_handler = ask_tick};
    sigemptyset(&on_usr1.sa_mask);
    sigaction(SIGUSR1, &on_usr1, NULL);
    printf("ready %s %s %s %s usr1\n", launches, copies[0] ? copies : "-",
           waits[0] ? waits : "-", push ? "wakes" : "-");
    fflush(stdout);

    int fd = bpf_map__fd(skel->maps.procs);
    unsigned long long interval_ns = (unsigned long long)interval_ms * 1000000ull;
    for (unsigned long n = 0;; n++) {
        tick_asked = 0;
        unsigned long long tick_ns = now_ns();
        printf("t %llu\n", tick_ns);
        unsigned key, next, gone[256];
        int ngone = 0, more = bpf_map_get_next_key(fd, NULL, &next) == 0;
        while (more) {
            key = next;
            more = bpf_map_get_next_key(fd, &key, &next) == 0;
            struct proc_stats s;
            if (bpf_map_lookup_elem(fd, &key, &s) != 0)
                continue;
            int i = slot_of(key);
            if (!seen[i].tgid || memcmp(&seen[i].s, &s, sizeof s) != 0) {
                seen[i].tgid = key;
                seen[i].s = s;
                printf("p %u %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", key,
                       s.launches, s.copies, s.first_ns, s.last_ns, s.period_ns, s.waits,
                       s.wait_ns, s.wait_start_ns, s.wait_end_ns, s.inputs, s.input_ns,
                       s.input_after_ns);
            }
            if (n % 100 == 0 && ngone < 256 && kill((pid_t)key, 0) != 0 && errno == ESRCH)
                gone[ngone++] = key;
        }
        for (int g = 0; g < ngone; g++) {
            bpf_map_delete_elem(fd, &gone[g]);
            forget(gone[g]);
            printf("x %u\n", gone[g]);
        }
        if (printf(".\n") < 0 || fflush(stdout) != 0)
            return 0; /* nobody reads any more */
        /* until the next tick is due, print each wake as it comes (once at least) */
        unsigned long long due = tick_ns + interval_ns, at = now_ns();
        if (!wakes) {
            if (at < due && !tick_asked) {
                struct timespec rest = {(due - at) / 1000000000ull, (due - at) % 1000000000ull};
                nanosleep(&rest, NULL); /* a SIGUSR1 ends it early */
            }
            continue;
        }
        do {
            int ms = at < due && !tick_asked ? (int)((due - at + 999999) / 1000000) : 0;
            int got = ring_buffer__poll(wakes, ms);
            if (got < 0 && got != -EINTR)
                break;
            if (woke && fflush(stdout) != 0)
                return 0;
            woke = 0;
            at = now_ns();
        } while (at < due && !tick_asked);
    }
}
