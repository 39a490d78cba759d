"""The worker loops: what ``manage.py kumiflow_worker`` runs.

- :mod:`.loop`: the shape every loop shares (poll, sleep until due or told);
- :mod:`.listener`: PostgreSQL ``LISTEN`` relaying notifications to the loops;
- :mod:`.resume`, :mod:`.dispatch`, :mod:`.cron`: the three loops;
- :mod:`.worker`: the loops together in one process, one shutdown.

Imports the layers below: the engine, the outbox, cron.
"""
