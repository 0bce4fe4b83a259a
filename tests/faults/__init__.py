"""The fault tier (``make test-faults``): real nodes in network namespaces, many
migrations, and a fault at every step of the migration protocol in turn (see
:mod:`tests.faults.harness`; the lab in :mod:`tests.faults.lab`, the steps and their
rotation in :mod:`tests.faults.plan`, the figures in :mod:`tests.faults.report`)."""
