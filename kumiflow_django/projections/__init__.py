"""Projections: the rows the engine and your code read, folded from the log.

- :mod:`~kumiflow_django.projections.stream`: the one stream-write helper
  (events at the next versions, folded into the row, written together with a
  version guard, announced);
- :mod:`~kumiflow_django.projections.runs`, :mod:`.dispatches`,
  :mod:`.schedules`: each model beside its fold;
- :mod:`~kumiflow_django.projections.user`: your own projections
  (``define_projection``);
- :mod:`~kumiflow_django.projections.rebuild`: every table again from the log.

Imports only :mod:`kumiflow_django.store` and :mod:`kumiflow_django.definition`.
"""
