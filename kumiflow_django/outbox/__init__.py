"""The outbox: side effects delivered after their segment committed.

- :mod:`.kinds`: the ways of delivering (``mail``, ``webhook``, yours), one registry;
- :mod:`.mail`, :mod:`.webhook` (with :mod:`.ssrf`, its guard): the built-in kinds;
- :mod:`.errors`: moved (``DeliveryFailure`` is in :mod:`kumiflow_django.store.errors`);
- :mod:`.requests`: the dispatch streams a segment opens for its steps' requests;
- :mod:`.delivery`: claim, deliver, record one dispatch (at least once, one key);
- :mod:`.actions`: redeliver, cancel, prune.

The ``Dispatch`` rows and their fold live in
:mod:`kumiflow_django.projections.dispatches`; what a step records is in
:mod:`kumiflow_django.steps.dispatch`. Imports only the layers below:
store, definition, steps, projections.
"""

from __future__ import annotations

from kumiflow_django.store.deprecation import moved_names

# Names this package had as a module before 0.2, for code that imported them.
_MOVED = {"request": "kumiflow_django.steps.dispatch"}


__getattr__ = moved_names(__name__, _MOVED)
