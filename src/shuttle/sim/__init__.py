"""The discrete-event simulator of a file server that hosts mobile code.

Layout (one concept a module):

* ``kernel``   the event kernel: a heap of (time, priority+sequence, handler, arg)
* ``mm1``      M/M/1 on our kernel and on SimPy with the same draws (bench-kernel)
* ``cli``      ``shuttle sim ...`` commands
"""

from shuttle.sim.kernel import Kernel

__all__ = ["Kernel"]
