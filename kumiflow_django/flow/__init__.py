"""Flow control: concurrency limits per key, rates, and the rows they keep.

- :mod:`.admission`: the rules, for runs and task attempts alike: admit,
  park, release, the sweep under the wakes, the invariant;
- :mod:`.gates`: what "active" and "parked" mean for each kind, in rows;
- :mod:`.models`: ``FlowKey`` (the row every admission for a key locks),
  ``RateBucket`` (a key's current window), ``FlowLimit`` (an operator's override);
- :mod:`.limits`: operators' overrides, idle keys.

What is declared (``Limit``, ``Rate``, priorities) lives in
:mod:`kumiflow_django.definition.flow`; a run's keys are resolved at its
start (:mod:`kumiflow_django.engine.run_start`).
"""
