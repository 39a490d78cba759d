"""The step vocabulary: builders for the steps of ``define_workflow(steps=[...])``.

Each kind lives in its own module behind one registry
(:data:`kumiflow_django.definition.step.step_kinds`); register your own kind
with :func:`register_step_kind`. Besides the kinds: :mod:`.control` (how a
step suspends, returns or fails), :mod:`.runner` (running a list of steps
from a cursor), :mod:`.dispatch` (what a step that asks for a side effect
records). Imports only :mod:`kumiflow_django.store` and
:mod:`kumiflow_django.definition`.
"""

from kumiflow_django.definition.step import Step, StepKind, register_step_kind, resolve
from kumiflow_django.steps.append_event import append_event
from kumiflow_django.steps.approval import approval
from kumiflow_django.steps.attributes import set_attributes
from kumiflow_django.steps.branch import branch
from kumiflow_django.steps.call import call, handler
from kumiflow_django.steps.child import child
from kumiflow_django.steps.compute import compute
from kumiflow_django.steps.for_each import for_each
from kumiflow_django.steps.mail import mail_send
from kumiflow_django.steps.model import model
from kumiflow_django.steps.parallel import parallel
from kumiflow_django.steps.read import read
from kumiflow_django.steps.retry import retry
from kumiflow_django.steps.return_ import return_
from kumiflow_django.steps.task import task
from kumiflow_django.steps.wait import wait
from kumiflow_django.steps.wait_for_event import wait_for_event
from kumiflow_django.steps.webhook import webhook_send
from kumiflow_django.store.deprecation import moved_names

__all__ = [
    "Step",
    "StepKind",
    "append_event",
    "approval",
    "branch",
    "call",
    "child",
    "compute",
    "for_each",
    "handler",
    "mail_send",
    "model",
    "parallel",
    "read",
    "register_step_kind",
    "resolve",
    "retry",
    "return_",
    "set_attributes",
    "task",
    "wait",
    "wait_for_event",
    "webhook_send",
]

# moved to kumiflow_django.store.errors in 0.2 (import them from kumiflow_django)
__getattr__ = moved_names(
    __name__, dict.fromkeys(("ChildFailed", "StaleVersion", "TaskFailed"), "kumiflow_django")
)
