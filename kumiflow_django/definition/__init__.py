"""What users declare: workflows, their triggers and steps, and the values in them.

- :mod:`.workflow`: ``define_workflow``, validation, the canonical form;
- :mod:`.triggers`: ``on_event``, ``on_cron``, ``manual``;
- :mod:`.step`: what a step is, the step-kind base class and its registry;
- :mod:`.context`: what resolvers see (``ctx``), and why a run wakes;
- :mod:`.registry`: the registered workflows and their versions;
- :mod:`.fingerprint`: a definition's stable hash;
- :mod:`.durations`, :mod:`.backoff`, :mod:`.matching`: the values definitions
  hold (ISO 8601 durations, retry policies, event match specs and look-back).

Imports only :mod:`kumiflow_django.store`.
"""
