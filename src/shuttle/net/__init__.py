"""Moving bytes: the only package with sockets in it.

Layout:

* ``registry``  operations a node serves, as a registry of named handlers
* ``server``    the asyncio (uvloop) server that runs a registry over the wire codec
* ``node_protocol``  one client connection of a node: requests answered once, backpressure,
  the read lane; with ``node_handshake`` (challenge, HELLO, refusals), ``node_dispatch``
  (a request the general way), ``node_tls_edge`` (TLS at its edges) and ``node_closing``
  (how it ends: protocol errors, the sweep's timeouts, revocation, GOODBYE)
* ``server_stats``  the server's counters (``node.stats``), compiled with the hot path
* ``admission`` what a client may make a node hold: connections, descriptors, time
* ``auth``      cluster-key authentication: key files, proofs, the handshake's checks
* ``principals``  principals and their caps (cephx-like), derived keys, a node's book,
  the guards operations check a principal's requests with
* ``principal_limits``  how much of a node each principal may hold (connections,
  requests in flight, hosted objects)
* ``tls``       TLS 1.3 contexts and one connection's TLS as bytes in, bytes out (sans-I/O)
* ``certs``     the cluster's CA and the nodes' certificates (``cluster up --tls``)
* ``blocking``  a blocking-socket connection to a node (the sync client's transport):
  handshake, calls, the read lane, pipelining
* ``blocking_stream``  the bytes under it: the socket, TLS, an emulated link, typed
  failures
* ``aio``       an asyncio connection to a node (the async client's and run-time's transport)
* ``clock``     the clock protocol (real and, in ``shuttle.testing``, fake)
* ``profiles``  link profiles (bandwidth, latency) by name
* ``shaping``   token bucket + delay link emulation, driven by a clock
* ``shaped_socket``  the same link emulation around a blocking socket (pipelined)
* ``cpu``       the CPU speed factor of a node (burns CPU to emulate a slower node)
* ``netns``     network namespaces joined by veth pairs shaped with ``tc ... tbf``
* ``attr_rows`` the compact rows form of many objects' attributes (``stat_many``,
  ``callback.promise_many``, ``callback.promise_list``)
* ``addresses`` ``HOST:PORT`` parsing and :class:`NodeAddress`, shared by every layer above
* ``memory``    allocator tuning for processes that move large buffers
"""
