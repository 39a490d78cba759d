"""The event log: the bottom layer, which every other one builds on.

- :mod:`.models`: the ``Event`` table (and the manager every model uses);
- :mod:`.log`: appending, reading and erasing (the write path of applications);
- :mod:`.immutability`: append-only in the database itself, and the erasure permit;
- :mod:`.values`: what a storable JSON value is; :mod:`.limits`: column widths;
- :mod:`.sql`: plain SQL for the hot writes; :mod:`.db`: which database,
  its locks, what its errors mean;
- :mod:`.names`: the engine's event types, stream types and reasons;
- :mod:`.errors`: the exceptions of the public API;
- :mod:`.clock`: the one clock; :mod:`.leases`: when a lease is free;
  :mod:`.wakeups`: telling loops about committed work;
- :mod:`.registry`: the shape every extension point shares.

Imports nothing of kumiflow-django but :mod:`kumiflow_django.conf` and
:mod:`kumiflow_django.signals`.
"""
