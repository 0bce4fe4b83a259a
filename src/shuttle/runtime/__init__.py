"""Shuttle's run-time for mobile objects (ABACUS, ``../shared/papers/abacus-...``).

Layout (one module per concept; docs/runtime.md explains the model):

* ``ids``        network-wide object ids: home run-time + local id
* ``refs``       location-transparent references (:class:`Ref`)
* ``values``     how arguments, results and checkpoints travel (msgpack + references)
* ``mobile``     the programming model: :class:`MobileObject`, anchored objects,
  object managers, built-in types by name
* ``sandbox``    shipped classes in worker processes with memory/CPU/time limits
  (``sandbox_worker`` is the worker's side; ``sandbox_frames``: the frames the two
  sides speak; ``sandbox_limits``: the limits, and why a worker ended)
* ``shipping``   a user's class pickled by value for a node (only a worker loads it)
* ``jail``       the jail of a shipped object, as the node sees it: can it be built,
  its uid and cgroups (``jail_enter``: building it, in the worker; ``jail_seccomp``:
  its system-call filter)
* ``patterns``   user patterns compiled for RE2 (linear time), as built-ins take them
* ``budget``     CPU and wall budgets of a built-in object's call at a node
* ``gate``       admission of calls to a hosted object: quiesce, drain, redirect
* ``monitor``    the resource monitor: CPU, bytes per edge, stall, per window H
* ``load``       node load L from the kernel's per-thread and per-CPU accounting
* ``placement``  the placement model of section 5.4 (pure: no I/O), its front; by
  concept: ``placement_views`` (its inputs), ``placement_costs`` (one stack's
  equations 3-6, the measured per-call overhead, a move's price),
  ``placement_load`` (equations 5-7: the server load's fixed point),
  ``placement_choice`` (the greedy choice of 5.4.3), ``placement_verdicts`` (its
  verdict on each move), ``placement_plan`` (an evaluation's record),
  ``placement_budget`` (the servers' CPU budget, many clients), ``placement_many`` (what the
  many-clients rule reads differently: queued calls, completed calls),
  ``placement_climb`` (the admission edge hill-climbed on the clients' calls a second)
* ``sites``      the model's three sites for data in Ceph: client, node, OSD (pure)
* ``site_probe`` a grep's costs from a probe, and the site the three-site model picks
* ``osd``        the OSD as a site: grep and count run in Ceph's OSDs (cls_lua), bounded
  (``osd_lua`` holds the Lua)
* ``digest``     what one run-time saw over a window, as the resource managers read it
* ``planner``    the resource manager: digests → stacks → decisions, decision log
* ``planner_input``  the pure part: digests, the node's facts and its location table
  → the stacks the model sees, and who carries out each move
* ``hosting``    making, restoring and ending hosted objects (the one builder of
  :class:`~shuttle.runtime.hosted.Hosted`), their managers and sandboxes
* ``hosted``     a hosted object's record: its gate, epoch, lease, stage and durable writes
* ``locations``  the location table: hosted, homed (with epochs), hints, migrating
* ``moves``      the record of migrations: events, last moves, failures
* ``binding``    the binding manager: ids, references, the loop bridge, an object's
  life here, over the three above and the two below
* ``invocation`` calling an object wherever it runs: plain call or RPC, following
  its moves, asking its home where it is
* ``hosted_calls`` a call entering an object hosted here: the principal's check, its
  gate, the monitor, re-entry by call chain, a durable write; remote calls served
* ``migration_machine`` a migration as a state machine with no I/O (events in,
  instructions out)
* ``migration``  its executor: the source's side of a move
* ``migration_target``  the target's side: install staged, activate, abort, a
  stage its source left settled
* ``migration_home``  the home's side: commit a move, or resolve and fence it
* ``durable``    durable objects, the home's side: records, leases granted,
  re-activation
* ``durable_host`` durable objects, the host's side: writes before answers, leases held
* ``durable_records`` a durable object's record on its home's disk (two slots)
* ``faultpoints`` test hooks that hold a migration at a named step (the fault tier)
* ``peers``      connections to other run-times, one per peer and acting principal
* ``authority``  who an object's calls act for (its creator), what a principal may call
* ``service``    the run-time's operations on the wire
* ``ticker``     the periodic work of every run-time: monitor snapshots, load samples
* ``host``       the run-time inside a storage node
* ``client``     :class:`Runtime`, an application's run-time
* ``client_digests``  what an application's run-time tells the nodes each window, and when
* ``config``     :class:`RuntimeConfig` (H, B_thresh, limits)

Dependencies point down: nothing in ``wire``, ``net``, ``store`` or ``client``
imports this package; ``placement`` and ``sites`` import nothing that does I/O.
"""
