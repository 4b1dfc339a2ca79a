/* The launch probe's kernel side: per process (tgid), counts of kernel launches and async
 * copies, first and last of their times, and the waits (a wait in progress, time waited).
 * Copies with a direction also mark the next input: a host-to-device copy after a
 * device-to-host one that followed a launch (input, kernels, output: the next task's input).
 * A launch after wake_gap_ns without a launch or the return of a wait that followed one (a
 * possible busy edge) is also sent at once through the wakes ring buffer: a wait for a copy
 * alone (an input copied in and waited for before the launch) ends no busy period. Where
 * wakes are sent, so is the return of a wait that followed a launch (a busy period's
 * possible end: the reader times its idle edge from it), at most one a wake gap. It reads the time and the calling
 * process's tgid, never a call's arguments or memory. */
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

struct proc_stats {
    __u64 launches;
    __u64 copies;
    __u64 first_ns;     /* first launch (CLOCK_MONOTONIC) */
    __u64 last_ns;      /* last launch */
    __u64 period_ns;    /* first launch since the last wait returned: a busy period's start */
    __u64 waits;        /* waits that returned */
    __u64 wait_ns;      /* time spent in waits (overlapping waits count once) */
    __u64 wait_start_ns;/* start of the wait in progress, 0 when none */
    __u64 wait_end_ns;  /* return of the last wait */
    __s64 depth;        /* threads in a wait now */
    __u64 inputs;       /* next inputs: a host-to-device copy after an output after a launch */
    __u64 input_ns;     /* the newest next input's first host-to-device copy */
    __u64 input_after_ns; /* the last launch before it */
    __u64 stage;        /* 1 launched since the last next input, 2 and copied out since */
    __u64 burst_end_ns; /* return of the last wait with a launch since the wait before it */
    __u64 quiet_ns;     /* the last such return pushed (at most one a wake_gap_ns) */
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 8192);
    __type(key, __u32);
    __type(value, struct proc_stats);
} procs SEC(".maps");

struct wake {
    __u32 tgid;
    __u32 kind; /* WAKE: a launch after a quiet; QUIET: a wait's return after a launch */
    __u64 ns;   /* its time (CLOCK_MONOTONIC) */
};

enum { WAKE, QUIET };

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 64 * 1024);
} wakes SEC(".maps");

/* set by the loader before loading */
const volatile __u64 wake_gap_ns = 0;

static __always_inline struct proc_stats *stats_of(__u32 tgid) {
    struct proc_stats *s = bpf_map_lookup_elem(&procs, &tgid);
    if (s)
        return s;
    struct proc_stats zero = {};
    bpf_map_update_elem(&procs, &tgid, &zero, BPF_NOEXIST);
    return bpf_map_lookup_elem(&procs, &tgid);
}

static __always_inline void wake(__u32 tgid, __u32 kind, __u64 now) {
    struct wake *w = bpf_ringbuf_reserve(&wakes, sizeof *w, 0);
    if (!w)
        return;  /* full: the next tick shows the call */
    w->tgid = tgid;
    w->kind = kind;
    w->ns = now;
    bpf_ringbuf_submit(w, 0);
}

enum { LAUNCH, COPY, COPY_IN, COPY_OUT };

static __always_inline int work(int call, int push) {
    __u64 now = bpf_ktime_get_ns();
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct proc_stats *s = stats_of(tgid);
    if (!s)
        return 0;  /* the map is full: this process goes uncounted */
    if (call != LAUNCH) {
        __sync_fetch_and_add(&s->copies, 1);
        if (call == COPY_OUT && s->stage)
            s->stage = 2;
        if (call == COPY_IN && s->stage == 2) {
            s->input_ns = now;
            s->input_after_ns = s->last_ns;
            s->stage = 0;
            __sync_fetch_and_add(&s->inputs, 1);
        }
        return 0;
    }
    s->stage = 1;
    __sync_fetch_and_add(&s->launches, 1);
    if (!s->first_ns)
        s->first_ns = now;
    if (s->period_ns <= s->wait_end_ns)
        s->period_ns = now;
    __u64 quiet_since = s->last_ns > s->burst_end_ns ? s->last_ns : s->burst_end_ns;
    s->last_ns = now;
    if (push && wake_gap_ns && now - quiet_since >= wake_gap_ns)
        wake(tgid, WAKE, now);
    return 0;
}

/* on_launch_pushed where wakes are sent (the ring buffer needs Linux 5.8), else on_launch */
SEC("uprobe")
int on_launch(void *ctx) { return work(LAUNCH, 0); }

SEC("uprobe")
int on_launch_pushed(void *ctx) { return work(LAUNCH, 1); }

/* a copy whose direction the entry point does not say (cuMemcpyAsync) */
SEC("uprobe")
int on_copy(void *ctx) { return work(COPY, 0); }

SEC("uprobe")
int on_copy_in(void *ctx) { return work(COPY_IN, 0); }

SEC("uprobe")
int on_copy_out(void *ctx) { return work(COPY_OUT, 0); }

SEC("uprobe")
int on_wait(void *ctx) {
    __u64 now = bpf_ktime_get_ns();
    struct proc_stats *s = stats_of(bpf_get_current_pid_tgid() >> 32);
    if (!s)
        return 0;
    if (__sync_fetch_and_add(&s->depth, 1) == 0)
        s->wait_start_ns = now;
    return 0;
}

static __always_inline int wait_returned(int push) {
    __u64 now = bpf_ktime_get_ns();
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct proc_stats *s = bpf_map_lookup_elem(&procs, &tgid);
    if (!s)
        return 0;
    __s64 before = __sync_fetch_and_add(&s->depth, -1);
    if (before <= 0) {  /* entered before the probe attached */
        __sync_fetch_and_add(&s->depth, 1);
        return 0;
    }
    if (before == 1) {
        __u64 start = s->wait_start_ns;
        if (start && now > start)
            __sync_fetch_and_add(&s->wait_ns, now - start);
        s->wait_start_ns = 0;
        if (s->last_ns > s->wait_end_ns) {
            s->burst_end_ns = now;
            /* at most one a gap: a read asked for after the first finds the period
             * settled and asks again itself, or the next return is a gap later */
            if (push && wake_gap_ns && now - s->quiet_ns >= wake_gap_ns) {
                s->quiet_ns = now;
                wake(tgid, QUIET, now);
            }
        }
        s->wait_end_ns = now;
    }
    __sync_fetch_and_add(&s->waits, 1);
    return 0;
}

/* on_wait_return_pushed where wakes are sent, else on_wait_return */
SEC("uretprobe")
int on_wait_return(void *ctx) { return wait_returned(0); }

SEC("uretprobe")
int on_wait_return_pushed(void *ctx) { return wait_returned(1); }

char LICENSE[] SEC("license") = "Dual BSD/GPL";
