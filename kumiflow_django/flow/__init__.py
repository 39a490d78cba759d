"""Flow control: concurrency limits per key, rates, and the rows they keep.

- :mod:`.models`: ``FlowKey`` (the row every admission for a key locks),
  ``RateBucket`` (a key's current window), ``FlowLimit`` (an operator's override);
- :mod:`.admission`: admit, park, release, under those locks;
- :mod:`.gates`: what "active" and "parked" mean for runs and task attempts.

What is declared (``Limit``, ``Rate``, priorities) lives in
:mod:`kumiflow_django.definition.flow`; where runs are admitted, in
:mod:`kumiflow_django.engine.admission`.
"""
