"""The worker loops: what ``manage.py kumiflow_worker`` runs.

- :mod:`.loop`: the shape every loop shares (poll, sleep until due or told);
- :mod:`.listener`: PostgreSQL ``LISTEN`` relaying notifications to the loops;
- :mod:`.resume`, :mod:`.dispatch`, :mod:`.cron`, :mod:`.tasks`: the four loops
  (the last one with kumiflow's pool of task threads);
- :mod:`.worker`: the loops together in one process, one shutdown.

Imports the layers below: the engine, the outbox, cron, tasks.
"""
