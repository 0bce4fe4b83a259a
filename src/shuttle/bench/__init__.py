"""The papers' experiments on the live system, each printing figures and writing JSON.

Layout:

* ``cli``      the ``shuttle bench ...`` typer sub-application: registers every command,
  in ``--help``'s order, and declares ``bench netrand``
* ``transport_cli``  ``bench shaping`` and ``bench stream``: the commands
* ``hostile_cli``  ``bench hostile`` and ``bench flood``: the commands
* ``runtime_cli``  ``bench jail`` and ``bench durable``: the commands
* ``client_reads_cli``  ``bench speculate`` and ``bench lookaside``: the commands
* ``session``  what every benchmark runs inside: stops what it started on any exit,
  prints progress off a terminal, says how long to expect
* ``nodes``    nodes for a benchmark: the one named, or a private one on loopback
* ``placement``  which CPU the client and servers of a latency benchmark run on
* ``redis_anchor``  a Redis server and a raw RESP client: the fast-fetch anchor
* ``netrand``  ``bench netrand``: random page-sized fetches, local against remote
* ``netrand_clients``  ``bench netrand --clients N``: the same fetches from N clients
  at once (throughput, p50, p99), against Redis with as many
* ``netrand_summary``  what ``netrand --clients`` makes of its clients' samples: each
  pass's figures, each slice's, the slice pairs' ratios
* ``netrand_reruns``  ``netrand --clients --repeat``: how far the figures move run to run
* ``netrand_machine``  what the machine did under each slice of ``netrand --clients``
* ``netrand_workers``  ``bench netrand --workers 1,2``: nodes of 1, 2... processes,
  interleaved, with where the CPU went
* ``stream``   ``bench stream``: one large object streamed, against raw TCP
* ``durable``  ``bench durable``: what a durable object's write before each answer
  costs a call, at its home, at another node and at the client
* ``hostile``  ``bench hostile``: what stalled, non-reading and idle clients cost a node
* ``flood``    ``bench flood``: a key holder's connect and put under connections that never
  authenticate (limits before authentication)
* ``jail``     ``bench jail``: the jail's start-up and filter cost; other clients'
  puts while grep runs the worst patterns
* ``shaping``  emulated link shaping against kernel ``tc ... tbf`` shaping in namespaces
* ``speculate``  ``bench speculate``: speculative remote read (Yi, section 4), live
* ``speculate_plots``  the PNG of ``bench speculate`` in the paper's layout
* ``abacus``   ABACUS's experiments (section 6): the shared harness and the filter
* ``abacus_cli``  ``shuttle bench abacus ...``: the group; registers its commands
* ``abacus_options``  what every ``bench abacus`` command shares: options, console,
  the report's JSON and PNG
* ``abacus_filter_cli``  ``bench abacus filter|competition|swing``: the commands
* ``objectfs_cli``  ``bench abacus raid|cache|directory|phases``: the commands
* ``mix_cli``  ``bench abacus mix``: the command
* ``abacus_plots``  PNG plots of the ABACUS experiments, in the paper's layout
* ``competition``  ABACUS 6.7: adapting to competition over resources
* ``mix``      ``bench abacus mix``: many client processes calling cheap and CPU-heavy
  filters; aggregate throughput at client, at node and adaptive (its passes); by
  concept: ``mix_settings`` (its flags and their checks), ``mix_clients`` (the forked
  client processes and their passes), ``mix_timeline`` (the nodes' CPU per second),
  ``mix_decisions`` (the decision logs read back), ``mix_report`` (per pass and the JSON),
  ``mix_cpus`` (the node's and the clients' CPUs read back: did the partition hold)
* ``node_profile``  a node process sampled by py-spy during a pass (``mix
  --profile-node``) and what its CPU went to, per second and by function
* ``swing``    conditions that swing around the break-even point: does it thrash?
* ``raid``     ABACUS 6.2: adapting to network topology, the RAID 5 object
* ``directory``  ABACUS 6.5: adapting to contention over shared data
* ``objectfs`` ABACUS 6.4 and 6.6 on the object-based file system
* ``objectfs_plots``  PNG plots of the file-system experiments
* ``ceph_stand``  what ``bench ceph netrand|stream`` measure on: a local Ceph, a node on
  the RADOS store and one on files, librados on the same pool, the same bytes in all
* ``ceph_node_stats``  what a RADOS node says about its reads: trust, counters, cache
* ``ceph_netrand``  ``bench ceph netrand``: random 4 KiB reads, the nodes against
  librados, interleaved
* ``ceph_stream``  ``bench ceph stream``: the whole object in 1 MiB reads, the nodes
  against librados, interleaved
* ``ceph_filter``  ``bench ceph filter``: grep at the client, the node or the OSD
  (cls_lua) on a shaped link, and where the placement model puts it
* ``ceph_cli``  ``shuttle bench ceph ...``: the commands
* ``lookaside``  the lookaside paper's Figure 6: a build over the FUSE mount with
  lookaside stores of older releases, at five bandwidths (the runs and the JSON)
* ``lookaside_plots``  its table in the paper's form and its PNG
* ``lookaside_releases``  the releases it builds from: sdists fetched and kept, the
  generated smoke-test project, the source files, and what rsync finds unchanged
* ``corpus``   a generated text corpus, the same bytes from the same seed
* ``objrecord``  a built-in object run in process over a live node, recorded
* ``calibrate``  ``shuttle sim calibrate``: a live node measured for the simulator
* ``predict``  ``shuttle sim predict``: record, calibrate, simulate both placements,
  beside the run-time's own model, and with ``--live`` the live runs
* ``liveruns``  ``shuttle grep`` at both placements, interleaved, until each median
  holds still (``sim predict --live``)
* ``simpredict``  ``bench sim-predict``: the predictions against live runs over links
  and node speeds (issue 24's validation)
* ``sim_cli``  the commands: ``sim calibrate``, ``sim predict``, ``trace record-object``,
  ``bench sim-predict``
"""
