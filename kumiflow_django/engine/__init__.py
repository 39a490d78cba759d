"""The engine: runs advance, one segment (one transaction) at a time.

- :mod:`.segment`: the events and rows of one segment; running its steps;
- :mod:`.runner`: the one segment runner: opening, failure, refusal, skip;
- :mod:`.starting`: starting runs (from an appended event, by hand, by cron);
- :mod:`.resuming`: resuming suspended runs, and waking runs an event satisfies;
- :mod:`.operations`: cancel, retry, wake (what the admin and commands call);
- :mod:`.receivers`: what the engine does with every appended event.

Imports the layers below: store, definition, steps, projections, outbox.
"""
