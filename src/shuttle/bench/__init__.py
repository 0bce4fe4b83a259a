"""The papers' experiments on the live system, each printing figures and writing JSON.

Layout:

* ``cli``      the ``shuttle bench ...`` typer sub-application (one command per benchmark)
* ``shaping``  emulated link shaping against kernel ``tc ... tbf`` shaping in namespaces
"""
