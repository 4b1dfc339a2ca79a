"""The names the exporter, the actuator, the rules and the dashboards share, defined once.

Each is a ``StrEnum``: a member *is* its string, so it goes into JSON, label values and
audit lines unchanged, while code that uses a name the other side does not know fails type
checking instead of a doc-parsing test. ``docs/interfaces.md`` describes the same names for
readers; ``tests/unit/test_package.py`` checks that it lists every one of them.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Where a running GPU task is in its life (the exporter's tracker)."""

    STARTING = "starting"  # seen on the device, nothing more yet
    INPUT = "input"  # memory grew: host-to-device input
    COMPUTING = "computing"  # SM samples show its kernels
    DRAINING = "draining"  # no SM activity for a while after computing: output, or done
    ENDED = "ended"  # finished (history only)


#: The phases of a task that still runs, in life order (``gpuguard_container_task_phase``).
RUNNING_PHASES: tuple[Phase, ...] = (Phase.STARTING, Phase.INPUT, Phase.COMPUTING, Phase.DRAINING)
#: Phases of a task whose kernel has not started: pausing it now still keeps it off the GPU.
PRE_KERNEL: frozenset[Phase] = frozenset({Phase.STARTING, Phase.INPUT})


class TaskMode(StrEnum):
    """What one GPU task of a container is (label ``gpuguard.task``, ``--task.default-mode``)."""

    PROCESS = "process"  # paper A: first appearance on the device to exit
    MEMORY = "memory"  # paper B: memory in use to memory freed (re-allocation splits)
    BURST = "burst"  # a busy period (SM activity or memory growth) ended by an idle gap


class TaskBoundary(StrEnum):
    """Whether a task's start and end are the real boundaries of one piece of work, and so
    whether it is judged against its deadline (the exporter's tracker).

    NVML samples a process every ~1/6 s and cannot see where one request of a busy server
    ends and the next begins: a burst with no idle gap may hold several requests, and
    timing it against one request's deadline would count false misses.
    """

    EXACT = "exact"  # process or memory mode, or a burst with an idle gap seen at both ends
    OPEN = "open"  # a running burst that began after an idle gap: judged when it ends
    MERGED = "merged"  # a burst that may hold several tasks: busy time, never a hit or miss
    NO_KERNEL = "no_kernel"  # ended without a kernel (a start-up context): not counted


class PriorityClass(StrEnum):
    """How the actuator treats a container's tasks (label ``gpuguard.class``).

    Without the label a container with a deadline is ``real-time``, else ``normal``.
    """

    REAL_TIME = "real-time"  # queued; freezes best-effort containers on its devices
    NORMAL = "normal"  # queued (paper B's admission), nothing more
    BEST_EFFORT = "best-effort"  # never queued: frozen while real-time work needs its GPU


class EventType(StrEnum):
    """The ``type`` of an event on the exporter's ``/api/v1/events`` stream."""

    TASK_STARTED = "task_started"
    TASK_PHASE = "task_phase"
    TASK_ENDED = "task_ended"
    DEADLINE_OVERRUN = "deadline_overrun"
    CONTAINER_PAUSED = "container_paused"
    CONTAINER_RESUMED = "container_resumed"
    CONTAINER_STARTED = "container_started"
    CONTAINER_REMOVED = "container_removed"
    #: the launch probe saw a container start GPU work (``ts``: its first launch)
    GPU_BUSY = "gpu_busy"
    #: ... and finish it (``ts``: the return of its last wait; ``busy_since``: the start)
    GPU_IDLE = "gpu_idle"


class ActivitySource(StrEnum):
    """How the exporter sees a container's GPU work (``gpuguard_container_activity_source``)."""

    LAUNCH = "launch"  # the launch probe: every launch and wait, timed in the kernel
    GAUGE = "gauge"  # the server's own in-flight gauge (gpuguard.inflight.metric)
    NVML = "nvml"  # NVML's (or gpusim's) per-process samples, ~1/6 s


class ProbeReason(StrEnum):
    """Why the launch probe does not see a container (``reason`` of the source metric)."""

    OFF = "off"  # --probe.launch=off
    NO_BINARY = "no_binary"  # the probe's program is missing and cannot be built here
    NO_PERMISSION = "no_permission"  # no CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN)
    NO_LIBRARY = "no_library"  # no libcuda.so.1 found, or no launch entry point in it
    FAILED = "failed"  # the probe started and then stopped (its log line says why)
    NO_CALLS = "no_calls"  # the probe runs, but this container made no driver call yet


class Role(StrEnum):
    """``gpuguard.role`` of gpuguard's own containers: never paused."""

    EXPORTER = "exporter"
    ACTUATOR = "actuator"
    GUARD = "guard"


COMPONENT_ROLES: frozenset[str] = frozenset(Role)


class AlertAction(StrEnum):
    """What an alert makes the actuator do (``rules/actions.yml``).

    In code, "action" means this alone: what the actuator does to a container or a node is
    a ``Verb``, and one container the policy pauses or unpauses is a ``Step`` (its reason a
    ``StepReason``). The wire keeps its names (the metric label and audit field ``action``).
    """

    ADMISSION = "admission"  # run admission control for the alert's node/gpu
    MARK_NODE = "mark_node"  # node unprovisionable while the alert fires
    RESUME_ALL = "resume_all"  # fail open: resume what this actuator paused on the node
    RECORD = "record"  # audit only
    #: a real-time container's latency SLO fails: freeze best-effort containers on its GPUs
    #: (sooner and longer) while the alert fires; mark the node when none can be frozen
    PROTECT_SLO = "protect_slo"


class Verb(StrEnum):
    """What the actuator does to a container or a node (``gpuguard_actuator_actions_total``'s
    and the audit's ``action``)."""

    PAUSE = "pause"
    UNPAUSE = "unpause"
    MARK_NODE = "mark_node"
    UNMARK_NODE = "unmark_node"


class StepReason(StrEnum):
    """Why a step pauses or unpauses a container: the policy's, or the safety net's (audit
    log and webhook reply ``reason``)."""

    NEWCOMER = "newcomer"  # a task arrived while the GPU is occupied
    ADMIT = "admit"  # its turn in the queue
    MEMORY_PRESSURE = "memory_pressure"  # admitted last, before its kernel, memory too high
    TASK_GONE = "task_gone"  # paused by us, no running task any more
    RESUME_ALL = "resume_all"  # fail open, or the actuator stops
    MAX_PAUSE = "max_pause"  # paused longer than --max-pause
    RECONCILE = "reconcile"  # the journal's record has no reason left
    JOURNAL_LOST = "journal_lost"  # the journal was unreadable: every managed pause undone
    GANG = "gang"  # uses several GPUs and is not admitted on every one of them
    BEST_EFFORT = "best_effort"  # best-effort, and a real-time task runs or waits on its GPU
    REALTIME_IDLE = "realtime_idle"  # best-effort, and no real-time task needs its GPUs now
    BEST_EFFORT_SHARE = "best_effort_share"  # best-effort, thawed for its minimum share
    PREEMPT = "preempt"  # its task holds a device that a task with precedence waits for
    YIELD = "yield"  # goes straight on: frozen as it drains, for the first waiter
    #: best-effort, and a real-time container's SLO alert fires on its GPU (protect_slo):
    #: frozen sooner and longer, whether or not a real-time task runs there now
    SLO_PRESSURE = "slo_pressure"
    #: real-time, frozen (preempted or waiting) for as long as its slack allows (its
    #: deadline less its typical run and ``--policy.slack-margin``): thawed, whatever the
    #: queue says
    SLACK = "slack"
    #: best-effort beside active real-time work under rate control: frozen or thawed by its
    #: device's duty cycle (``--policy.best-effort-control=rate``)
    DUTY_CYCLE = "duty_cycle"


#: Unpause reasons that start a chance to run: the journal records when (``Ledger.admitted``).
ADMITTING_REASONS: frozenset[StepReason] = frozenset(
    {StepReason.ADMIT, StepReason.BEST_EFFORT_SHARE, StepReason.SLACK, StepReason.DUTY_CYCLE}
)


class Result(StrEnum):
    """How an action ended (``gpuguard_actuator_actions_total{result}``)."""

    OK = "ok"
    ALREADY = "already"
    SKIPPED = "skipped"
    FAILED = "failed"
    DRY_RUN = "dry_run"


class SkipReason(StrEnum):
    """Why the policy or executor held back (``gpuguard_actuator_skipped_total{reason}``)."""

    UNMANAGED = "unmanaged"
    GPUGUARD_COMPONENT = "gpuguard_component"
    VANISHED = "vanished"
    CAP = "cap"
    STALE_STATE = "stale_state"
    IRRELEVANT_ALERT = "irrelevant_alert"
    KERNEL_RUNNING = "kernel_running"  # --policy.preempt=false: a launched task is left alone
    RUN_QUANTUM = "run_quantum"  # admitted less than --policy.preempt-quantum ago
    PREEMPT_FUTILE = "preempt_futile"  # the waiter misses anyway; the holder would miss too
    INPUT_TIMEOUT = "input_timeout"
    MEMORY_PRESSURE = "memory_pressure"
    RUNS_ELSEWHERE = "runs_elsewhere"
    MAX_PAUSE_EXEMPT = "max_pause_exempt"
    FAIL_OPEN = "fail_open"  # a resume_all alert fires for this node: no pauses meanwhile
    STALE_ALERT = "stale_alert"  # a late duplicate of an alert already resolved (HA peers)
    JOURNAL_UNWRITABLE = "journal_unwritable"  # a pause the journal cannot record is not taken
    #: real-time, and its slack is spent: a freeze now would outlast it
    NO_SLACK = "no_slack"
    #: a server's busy period is not a task (it may merge requests), and no SLO signal says
    #: it can afford a wait: it shares the device with the task that would have precedence
    NOT_RANKED = "not_ranked"


class TriggerSource(StrEnum):
    """What started a decision (``gpuguard_actuator_decision_seconds{trigger}``)."""

    WEBHOOK = "webhook"
    FAST = "fast"
    RECONCILE = "reconcile"
    TIMER = "timer"  # a hold, a quantum or a best-effort share fell due


class StateReason(StrEnum):
    """Why the node record puts a GPU (or a node) in state 0 (``gpuguard/exporter/record.py``)."""

    MISSED_DEADLINE = "missed_deadline"  # a task on it missed its deadline within the window
    SATURATED = "saturated"  # a kernel ran nearly all of the short busy window ("100%")
    MEMORY_FULL = "memory_full"  # used memory at or above the threshold ("100%")
    NO_GPU = "no_gpu"  # node only: no GPU in its record (the GPU source fails, or none)


class RankReason(StrEnum):
    """Why the placer passed over a node or GPU (``/api/v1/placement``, ``gpuguard nodes``).

    The record's own state-0 reasons (``StateReason``) appear beside these.
    """

    STALE = "stale"  # the node's record is older than --records.max-age
    MARKED = "marked"  # its actuator marks it unprovisionable (gpuguard.provisionable=false)
    MEMORY = "memory"  # free memory less what the placer reserved < requested + headroom
    FLOAT_TIME = "float_time"  # paper C: float time not larger than the new deadline
    PREDICTED_MISS = "predicted_miss"  # contention model: the new task would miss
    GPU_MODEL = "gpu_model"  # not the GPU model the request asked for
    INVALID_RECORD = "invalid_record"  # its record holds NaN, an infinity or a value out of range


class NodeListExecutor(StrEnum):
    """How the actuator's node marks take effect (``/api/v1/nodes``' ``executor``)."""

    SWARM = "swarm"  # a marked node gets the Swarm label gpuguard.provisionable=false
    LIST_ONLY = "list_only"  # the engine is in no swarm: the list is kept, no label is set


class WorkloadKind(StrEnum):
    """What a gpusim workload process does (``python -m gpuguard.gpusim.workload KIND``)."""

    ONESHOT = "oneshot"  # paper B's matmul task, once per run
    SERVER = "server"  # a long-lived inference server answering requests
    TRAIN = "train"  # a training loop: steps of kernels, a sync every k steps


class WorkloadEvent(StrEnum):
    """The ``event`` of a workload's log line (its own ground-truth timestamps)."""

    TASK_START = "task_start"
    CONTEXT_CREATED = "context_created"
    INPUT_START = "input_start"
    INPUT_END = "input_end"
    KERNEL_START = "kernel_start"
    KERNEL_END = "kernel_end"
    OUTPUT_START = "output_start"
    OUTPUT_END = "output_end"
    TASK_END = "task_end"
    READY = "ready"  # server/train: context and cached memory in place
    REQUEST = "request"  # server: one request answered
    STEP = "step"  # train: one step finished on the device
    SYNC = "sync"  # train: the host waited for the device
    SUMMARY = "summary"  # server/train: totals at exit
    ERROR = "error"
