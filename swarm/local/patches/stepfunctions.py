"""moto's Step Functions interpreter: the ``states:startExecution`` integration, as AWS runs it.

The fan-out state machine's finalize loop continues as a new execution before the history limit
(``ContinueAsNew``: ``arn:aws:states:::states:startExecution`` with ``StateMachineArn``, ``Name``
and ``Input``). Step Functions takes an optimized integration's parameters in PascalCase and
calls the API with its own member names (``stateMachineArn``, ``name``, ``input``). moto 5.2.5
ported LocalStack's interpreter without that step (its base ``_normalise_parameters`` is a
no-op), so the boto3 call gets ``StateMachineArn=...`` and botocore's serializer fails with
``KeyError: 'StateMachineArn'``: every continuation would end the execution with
``States.Runtime`` locally, while it works on AWS. (The Lambda and S3 integrations are not
affected: their API members are PascalCase already.)

:func:`patch_sfn_start_execution` maps the parameters of the ``states:*`` integrations onto the
operation's input shape (moto's own ``_to_boto_request``, which matches names case-insensitively
through snake case), after moto's own normalisation (which turns an ``Input`` object into its
JSON text). Process-wide and idempotent; listed in docs/explanation/local.md.

:func:`patch_sfn_stop_stays_aborted`: an execution stopped while a task waits for its task token
(the finalize loop's ``Poll``) is ``ABORTED`` at once, as on AWS.
"""

from __future__ import annotations

import threading
from typing import Any

_APPLIED: set[str] = set()
_GUARD = threading.Lock()


def patch_sfn_start_execution() -> None:
    with _GUARD:
        if "sfn-start-execution" in _APPLIED:
            return
        import botocore.session
        from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
            state_task_service_sfn as sfn_service,
        )

        model = botocore.session.get_session().get_service_model("stepfunctions")
        task = sfn_service.StateTaskServiceSfn
        original = task._normalise_parameters

        def _normalise_parameters(
            self: Any,
            parameters: dict[str, Any],
            boto_service_name: str | None = None,
            service_action_name: str | None = None,
        ) -> None:
            original(self, parameters, boto_service_name, service_action_name)
            if service_action_name is not None:  # a describe for .sync: already boto's names
                return
            action = self.resource.api_action  # "startExecution"
            operation = model.operation_model(action[:1].upper() + action[1:])
            self._to_boto_request(parameters, operation.input_shape)

        task._normalise_parameters = _normalise_parameters  # type: ignore[method-assign]
        _APPLIED.add("sfn-start-execution")


def patch_sfn_stop_stays_aborted() -> None:
    """An execution stopped while a task waits for its token ended FAILED on moto, and only
    when the task's wait timed out: the stop did not end the wait, and the task's timeout error
    then replaced the stopped state (``Environment.set_error`` overwrites any state). On AWS a
    stopped execution is ``ABORTED`` at once, whatever its task was doing, and the sweeper reads
    that status. The patch ends the execution's waits for their tokens when it is stopped, and
    keeps a stopped program stopped."""
    with _GUARD:
        if "sfn-stop-stays-aborted" in _APPLIED:
            return
        from moto.stepfunctions.parser.asl.eval.environment import Environment
        from moto.stepfunctions.parser.asl.eval.program_state import ProgramStopped

        original_error, original_stop = Environment.set_error, Environment.set_stop

        def set_error(self: Any, error: Any) -> None:
            if isinstance(self._program_state, ProgramStopped):
                return
            original_error(self, error)

        def set_stop(self: Any, stop_date: Any, cause: str | None, error: str | None) -> None:
            original_stop(self, stop_date, cause, error)
            # every frame shares the execution's pool of task tokens: end the waits on them
            for endpoint in list(self.callback_pool_manager._pool.values()):
                endpoint.interrupt_all()

        Environment.set_error = set_error  # type: ignore[method-assign]
        Environment.set_stop = set_stop  # type: ignore[method-assign]
        _APPLIED.add("sfn-stop-stays-aborted")
