"""Admission control for shared GPUs: paper B's Algorithm 2, extended. Pure.

``decide.decide(state, trigger, config, ledger)`` turns one fresh exporter snapshot into the
pause/unpause steps (and the skips, with reasons) that admit GPU tasks:

* Queues: one per device, a whole GPU or one MIG instance (hardware-isolated: its own
  queue). Real-time and normal containers' *ranked* tasks are queued; best-effort ones are
  not, nor are servers' busy periods (see "Precedence" below).
* Queue order: FIFO by the task's own start (process start breaks ties) or EDF by absolute
  deadline; tasks without a deadline come after those with one, FIFO among them.
* A device is *occupied* while a task that is allowed to run is in ``starting``, ``input`` or
  ``computing``. A task in ``draining`` (kernel done, copying results out) no longer occupies:
  the exporter calls a task draining as soon as no SM sample stands for it any more (the
  driver's next sample is overdue, or came without it), and says so in an event, so the
  next task's memory input overlaps the previous task's output, which is how a managed run
  finishes earlier than running the tasks strictly one after another. A task stuck in
  ``starting``/``input`` for longer than ``input_timeout_s`` (from its start or its
  admission) stops counting, so an idle context cannot block the queue. A kernel that runs
  in a paused container still occupies (a frozen process's launched kernel keeps running,
  paper B). A saturated device with an active, non-draining task is occupied too.
* Headroom (beyond paper B, which admits while cores are under 100% and memory under 95%):
  tasks are admitted in queue order while each fits: the device is not saturated, memory is
  under ``memory_threshold``, and the candidate's expected SM share (its container's learnt
  demand; unknown = 1.0, the whole device) fits beside the shares of what runs. So light
  tasks run together (paper C's Fig. 4), and a task of unknown or full demand runs alone,
  one at a time as in paper B (``one_at_a_time``: always, as paper B). The first task that
  does not fit stops admission (no overtaking: a big task at the head is not starved by
  small ones behind it).
* While occupied, every managed newcomer that is not admitted is paused.
* Preemption (``--policy.preempt``, on by default). Freezing a process stops its next
  kernel launches; only what it already queued drains. Real programs keep their memory and
  launch back to back, so their tasks are first seen already computing: an admission that
  left computing tasks alone did nothing between two servers. So a computing task is a
  candidate like any other: when a task with precedence (queue order: real-time before
  normal, then FIFO or EDF) waits on a device that a later or looser task holds, the holder
  is frozen (``preempt``) and the waiter runs; frozen holders are thawed in queue order.
  Against thrash: a task admitted less than ``preempt_quantum_s`` ago is not preempted
  (``run_quantum``), and no holder is preempted when every waiter it would make way for
  misses its deadline anyway while the holder, left alone, would meet its own and, preempted,
  would not (``preempt_futile``; run times from the container's learnt ``typical_run_s``,
  else only deadlines already past count). With preemption off, a task whose kernel already
  runs is left alone and recorded as a skip (``kernel_running``), as paper B does.
* Precedence (``precedence``). Queue order, admission and preemption act only
  between ranked tasks: ``process`` and ``memory`` tasks, and the bursts of a container
  that is no server. A server (a long-lived burst-mode container: it begins new tasks
  already computing right after a drain, its memory cached, or goes straight on if
  real-time, and its busy periods merged work; or it declares a latency SLO) is never
  ranked, nor yields: NVML cannot see its requests, so its busy period is no task. Its SLO
  signal judges it instead: one whose protect_slo alert fires (``slo_at_risk``) goes first;
  one that declares an SLO whose alert does not fire can afford a bounded wait, and is
  frozen while a ranked task of its class or higher, or a server at risk, runs on its
  device; one without an SLO cannot be judged and shares the device (``not_ranked``). Two
  servers without SLO signals share.
* Slack: no freeze of a real-time container outlasts its slack, whatever the queue says. It
  is thawed (``slack``) at its deadline (else its SLO's target) less its run (``spare_s``) and
  ``slack_margin_s``, from its task's start (a ranked task) or from the freeze's start (a
  server, or a burst that merged or ran late); ``next_due`` says when. A real-time task
  whose slack is spent is not frozen (``no_slack``), and one thawed so is not frozen again
  for what held it then.
* Memory rule: never admit while GPU memory used > ``memory_threshold`` of total; then pause
  again the container admitted last if its task is not yet computing (cudaMalloc cannot
  over-commit).
* Gang admission: a container with tasks on several devices is admitted on all or none. A
  container not admitted on one of its devices is paused (reason ``gang``), and the devices
  are decided again without it; when several such containers block each other, the one
  latest in queue order yields, so the earliest always progresses.
* Priority classes: a best-effort container (``gpuguard.class=best-effort``) is frozen while a
  real-time task (a container with a deadline, or labelled ``real-time``) runs or waits on any
  of its devices, whatever its phase (freezing a many-kernel job stops new launches; the
  device frees once its queued kernels drain). No flapping: it stays frozen for a hold after
  the last real-time activity on its devices (``Recent.realtime_seen``; the hold doubles
  while freezes follow thaws closely, up to ``best_effort_hold_max_s``, and halves back when
  they stop), so a ``draining`` report that a next request already contradicts thaws
  nothing. Starvation guard over every sliding window: a frozen one is thawed once its
  frozen time within the last ``best_effort_window_s`` reaches ``1 - best_effort_min_share``
  of it, and frozen again only when a freeze of at least the hold fits in the window.
  ``Decision.next_due`` says when a hold, a share or a quantum falls due, and the
  controller decides again then (``timer``), not only on the next event. A light server
  whose requests NVML cannot separate (``light_servers``) freezes no one: it is
  scheduled as a whole, beside its best-effort neighbour, unless its SLO alert fires.
  Containers of the ``normal`` class keep paper B's admission and never freeze anyone.
  That is ``best_effort_control="hold"``; under ``"rate"`` (the default) best-effort work
  beside active real-time work (or under SLO pressure) runs its device's duty cycle instead
  (reason ``duty_cycle``; ``besteffort``'s doc), which replaces the hold, the light
  servers' exception and the starvation share.
* SLO pressure (``slo_pressure``: devices where a real-time container's latency SLO alert
  fires, ``actuator/slo.py``): a best-effort container on such a device is frozen
  even while
  no real-time task runs or waits there (between the server's requests, which NVML's samples
  see too late to freeze for), and its starvation share is ``slo_best_effort_min_share``
  instead, so it is frozen sooner and longer (reason ``slo_pressure``).
* Only ``gpuguard.managed=true`` containers that are not gpuguard's own (role exporter or
  actuator) are ever paused; unmanaged tasks, including processes in no container, count for
  occupancy but are never touched. At most ``max_actions`` containers per decision.

Containers this actuator paused whose tasks are all gone are unpaused (``task_gone``); one
that yielded between tasks waits for its turn, for no longer than its slack if real-time.

The modules, by concern (import each thing from the module that defines it):

* ``types``: the knobs, trigger, ledger and recent history in; the ``Decision`` out.
* ``views``: a task as the policy sees it (``TaskView``), and the steps made from one.
* ``order``: queue order (FIFO, EDF, classes).
* ``precedence``: what is ranked, servers and their SLO signals, the slack of a freeze.
* ``devices``: each device's plan, and the gangs; ``admit``: what runs on one device.
* ``yields``: repeaters that yield as they drain or between tasks.
* ``besteffort``: best-effort freezes, holds and the starvation guard; or duty cycles.
* ``cleanup``: releasing what is gone, and the cap.
* ``decide``: the composition, one fresh snapshot in, a ``Decision`` out.
"""
