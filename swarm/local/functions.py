"""Lambda without Docker: moto's ``Invoke`` runs the real handlers of the deployed functions.

moto's Docker-less Lambda backend echoes the payload of every ``Invoke``.
:func:`patch_lambda_invoke` replaces ``LambdaSimpleBackend.invoke`` so that an ``Invoke``
(direct, from the Step Functions interpreter's ``lambda:invoke``, or from the local SQS poller
and drain watcher) looks the function up in moto, takes its ``Handler`` and its ``Environment``
as deployed by CloudFormation, and calls ``functions.<name>.handler`` with the event and a
Lambda context. An exception becomes ``FunctionError: Unhandled`` with
``{"errorType", "errorMessage"}``, as in AWS.

Isolation. Many invocations run at once (the poller's lanes, the map's children, the API), and a
handler module holds per-sandbox state: Powertools' ``BatchProcessor`` and REST resolver keep the
current batch / request on the instance, and ``_cache`` holds the wiring. Sharing one module
between concurrent invocations loses batch item failures and mixes requests (seen: a retried
unit's message deleted, another batch failed whole). So each concurrent invocation gets its own
*sandbox*: a separate copy of the handler module (a cold start), reused by later invocations one
at a time, like a Lambda execution environment.

Environment variables are process-global, so the host never writes a function's environment into
``os.environ``: it keeps the invocation's environment in a thread-local, and
:meth:`swarm.wiring.Wiring.from_env` (which every handler calls on its cold start, with no
arguments) reads it from there, through the :class:`swarm.wiring.Host` this host installs, with
moto-backed clients signed with the function's own execution role (:mod:`swarm.local.patches.iam`).
What stays
process-global: the Powertools variables, the same for every function of the stack (checked at
start); Powertools ``Metrics`` (its metric set is class-level, shared by every instance), so
metrics are disabled locally (moto does not ingest EMF anyway); and Powertools ``Logger`` keys
(shared per service), so correlation keys in the local log can mix between concurrent
invocations.

The simulated model plane is one object per process, shared by every worker invocation, like a
real model endpoint's quota is shared by the whole fleet; its latency is time-scaled.

The bill (:mod:`swarm.local.billing`): every invocation is metered where it runs, with its
measured duration, its function's configured memory (:class:`FunctionProfile`), the time it
spent in the model call and, for the worker, sleeping for tokens (both time-scaled: the meter
converts them back to the deployed clock; a worker runs its batch's messages at once, so these
are the unions of its threads' spans, :meth:`Invocation.scaled_s`) and the rest of the
``waited_s`` its ``WorkReport`` gives (a probe around
:meth:`swarm.service.worker.Worker.process`, installed with the host). The running invocation is
a context variable: a handler's threads that run in a copy of its context are metered with it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from swarm import wiring
from swarm.adapters.simulated_model import SimulatedModelPlane
from swarm.core.agent_driver import KillPoint
from swarm.core.lanes import QueuedUnit
from swarm.core.ports import ConverseCall, ModelPlane, ModelRequest, ModelResult
from swarm.local import billing
from swarm.local.events import LambdaContext
from swarm.service.agent_loop import KilledHere

log = logging.getLogger("swarm.local")

#: Powertools variables read at import or at handler time; they must agree across functions.
PROCESS_WIDE = (
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_LOG_LEVEL",
)


class WorkerCrash(BaseException):
    """A simulated worker death (the sandbox killed mid-unit): a BaseException, so Powertools'
    batch processor does not turn it into a per-record failure; the whole invocation fails."""


#: what a simulated sandbox death raises: a single-call unit's crash after its model call, and an
#: agent unit's worker killed at a point of a turn (``FaultyModelPlane.kill``)
SANDBOX_DEATHS = (WorkerCrash, KilledHere)


@dataclass
class Fault:
    run_id: str
    unit_id: str | None  # None: any unit of the run
    remaining: int

    def hits(self, request: ModelRequest) -> bool:
        return (
            self.remaining > 0
            and self.run_id == request.run_id
            and self.unit_id in (None, request.unit_id)
        )


#: the longest a held model call waits (real seconds; a claim's lease is 54 s locally)
HOLD_AT_MOST_S = 30.0


@dataclass
class FaultyModelPlane:
    """The shared simulated plane, plus injected faults: a worker that calls the model for a
    matching unit bills its tokens and then dies before it can settle (the model call happened,
    the sandbox died). Faults target a batch (and optionally one unit), so a scenario's faults
    cannot hit another scenario's units."""

    plane: SimulatedModelPlane
    _armed: list[Fault] = field(default_factory=list)
    _crashed: Counter[str] = field(default_factory=Counter)  # per run id
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: runs whose model calls wait until released (a scenario holds work running by design)
    _holds: dict[str, threading.Event] = field(default_factory=dict)
    _waiting: Counter[str] = field(default_factory=Counter)  # calls held now, per run id
    #: per run id: the kill points of its agent units, and the units killed so far
    _kills: dict[str, tuple[tuple[KillPoint, ...], set[str]]] = field(default_factory=dict)
    _kills_at: Counter[tuple[str, str]] = field(default_factory=Counter)

    def hold(self, run_id: str) -> None:
        """From now on, the run's model calls wait (each at most ``HOLD_AT_MOST_S``, well within
        a claim's lease) until :meth:`release`: its attempts stay running, by construction."""
        with self._lock:
            self._holds.setdefault(run_id, threading.Event())

    def release(self, run_id: str) -> int:
        """The run's held calls go on, and later ones no longer wait; how many were held."""
        with self._lock:
            gate = self._holds.pop(run_id, None)
            held = self._waiting[run_id]
        if gate is not None:
            gate.set()
        return held

    def held(self, run_id: str) -> int:
        with self._lock:
            return self._waiting[run_id]

    def arm_crashes(self, n: int, run_id: str, unit_id: str | None = None) -> None:
        with self._lock:
            self._armed.append(Fault(run_id, unit_id, n))

    def crashed(self, run_id: str | None = None) -> int:
        with self._lock:
            return self._crashed[run_id] if run_id else sum(self._crashed.values())

    def arm_kills(self, run_id: str, points: Sequence[KillPoint]) -> None:
        """Kill workers of the run's agent units (swarm.service.agent_loop): each unit once, at
        one of ``points`` of its first or second model turn, both drawn from its id."""
        with self._lock:
            self._kills[run_id] = (tuple(points), set())

    def kill(self, item: QueuedUnit, point: KillPoint, turn: int) -> bool:
        """The workers' kill hook (``Worker.kill``): True to die here (counted as a crash)."""
        with self._lock:
            plan = self._kills.get(item.run_id)
            if plan is None or item.unit_id in plan[1]:
                return False
            digest = int(hashlib.sha256(item.unit_id.encode()).hexdigest(), 16)
            points = plan[0]
            if point != points[digest % len(points)] or turn != 1 + (digest // 7) % 2:
                return False
            plan[1].add(item.unit_id)
            self._crashed[item.run_id] += 1
            self._kills_at[(item.run_id, point.value)] += 1
            return True

    def kills(self, run_id: str) -> dict[str, int]:
        """The run's workers killed so far, by point."""
        with self._lock:
            return {p: n for (r, p), n in self._kills_at.items() if r == run_id}

    def _gate(self, run_id: str) -> None:
        """Wait while the run is held (:meth:`hold`)."""
        with self._lock:
            gate = self._holds.get(run_id)
            if gate is not None:
                self._waiting[run_id] += 1
        if gate is not None:
            try:
                gate.wait(HOLD_AT_MOST_S)
            finally:
                with self._lock:
                    self._waiting[run_id] -= 1

    def converse(self, call: ConverseCall) -> Mapping[str, Any]:
        self._gate(call.run_id)
        started = time.perf_counter()
        try:
            return self.plane.converse(call)
        finally:  # the model call's share of the invocation (time-scaled), for the bill
            invocation = _current_invocation()
            if invocation is not None:
                invocation.span(MODEL, started, time.perf_counter())

    def invoke(self, request: ModelRequest) -> ModelResult:
        self._gate(request.run_id)
        started = time.perf_counter()
        try:
            result = self.plane.invoke(request)
        finally:  # the model call's share of the invocation (time-scaled), for the bill
            invocation = _current_invocation()
            if invocation is not None:
                invocation.span(MODEL, started, time.perf_counter())
        with self._lock:
            fault = next((f for f in self._armed if f.hits(request)), None)
            if fault is not None:
                fault.remaining -= 1
                self._crashed[request.run_id] += 1
        if fault is not None:
            raise WorkerCrash(f"simulated worker death during {request.unit_id}")
        return result


#: the key of :attr:`FunctionHost.longest_s` for one message of a worker's batch
WORKER_MESSAGE = "worker message"

#: the kinds of time-scaled spans of an invocation
MODEL, SLEEP = "model", "sleep"


@dataclass
class Invocation:
    """One invocation, and for the bill the spans of it (on the local clock) in which one of its
    threads was in a model call or sleeping for tokens: both time-scaled. A worker runs its
    batch's messages at once, so spans overlap; the bill takes their union (:meth:`scaled_s`)."""

    function_name: str
    env: Mapping[str, str]
    #: (kind, start, end) in ``time.perf_counter()`` seconds
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    #: the worker's reported waits for tokens outside its sleeps (its draws' requests)
    drawing_s: float = 0.0
    #: the invocation started a new sandbox (a cold start: its INIT is billed too)
    cold: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def span(self, kind: str, start: float, end: float) -> None:
        with self._lock:
            self.spans.append((kind, start, end))

    def add_drawing(self, seconds: float) -> None:
        with self._lock:
            self.drawing_s += max(0.0, seconds)

    def scaled_s(self) -> tuple[float, float]:
        """(in the model call, sleeping for tokens): the time in which at least one thread was
        in a model call, and the time in which none was but at least one slept for tokens."""
        with self._lock:
            spans = list(self.spans)
        model = union_s([(a, b) for kind, a, b in spans if kind == MODEL])
        return model, union_s([(a, b) for _, a, b in spans]) - model


def union_s(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals ``spans``."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@dataclass(frozen=True)
class FunctionProfile:
    """What the bill needs of a deployed function: its name in the bill (the handler's module,
    ``worker``), its configured memory and its architecture."""

    label: str
    memory_mb: int
    architecture: str = "x86_64"

    @classmethod
    def of(cls, configuration: Mapping[str, Any]) -> FunctionProfile:
        """From a ``GetFunction`` configuration."""
        handler = str(configuration["Handler"]).rpartition(".")[0]
        return cls(
            label=handler.rpartition(".")[2],
            memory_mb=int(configuration.get("MemorySize") or DEFAULT_MEMORY_MB),
            architecture=str((configuration.get("Architectures") or ["x86_64"])[0]),
        )


#: Lambda's memory when a function sets none
DEFAULT_MEMORY_MB = 128


class FunctionHost:
    """Runs the deployed functions' handlers in this process, each with its own environment."""

    def __init__(
        self,
        clients: Callable[[str], Any],
        model: FaultyModelPlane | None = None,
        time_scale: float = 1.0,
        role_clients: Mapping[str, Callable[[str], Any]] | None = None,
        profiles: Mapping[str, FunctionProfile] | None = None,
    ) -> None:
        self.clients = clients
        #: per function name: its label, memory and architecture in the bill
        self.profiles = dict(profiles or {})
        #: per function name: clients signed with the function's own execution role (the local
        #: stack's IAM is enforced); without an entry, ``clients``
        self.role_clients = dict(role_clients or {})
        self.model = model
        self.time_scale = time_scale  # the handlers' timers run this many times faster
        # the running invocation: a context variable, so the threads a handler runs its work on
        # in a copy of its context (the worker's messages) are metered with it
        self._current: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar(
            f"swarm_local_invocation_{id(self)}", default=None
        )
        self._lock = threading.Lock()
        self.invocations: Counter[str] = Counter()
        #: per function name: its longest invocation so far, in seconds on the local clock, and
        #: under WORKER_MESSAGE the longest a worker took over one message (from its drain check
        #: to its settlement): the emulator's stalls are not time-scaled, and a local claim's
        #: lease (LocalOptions.worker_timeout_s) must outlast them
        self.longest_s: dict[str, float] = {}
        self._idle: dict[str, list[ModuleType]] = {}
        self._sandboxes = 0

    def drop_idle(self) -> None:
        """Forget idle sandboxes (a redeploy): the next invocations are cold starts."""
        with self._lock:
            self._idle.clear()

    def clients_for(self, function_name: str) -> Callable[[str], Any]:
        return self.role_clients.get(function_name, self.clients)

    def invocation(self) -> tuple[Mapping[str, str], Callable[[str], Any]] | None:
        """The running invocation's environment and its function's clients (:class:`Host`)."""
        inv = self.current()
        return None if inv is None else (inv.env, self.clients_for(inv.function_name))

    def model_plane(self) -> ModelPlane | None:
        return self.model

    def current(self) -> Invocation | None:
        return self._current.get()

    def call(self, function_name: str, handler: str, env: Mapping[str, str], event: Any) -> Any:
        module_name, _, attr = handler.rpartition(".")
        sandbox, cold = self._acquire(function_name, module_name)
        invocation = Invocation(function_name, dict(env), cold=cold)
        token = self._current.set(invocation)
        serial = SERIALIZED.get(module_name, contextlib.nullcontext())
        queued = time.perf_counter()
        started: float | None = None
        try:
            with serial:  # waiting for it is this process's, not the function's, time
                started = time.perf_counter()
                return getattr(sandbox, attr)(event, LambdaContext(function_name))
        finally:
            measured = 0.0 if started is None else time.perf_counter() - started
            waited = (started or time.perf_counter()) - queued
            request = _request_line(event)
            if request is not None and waited + measured >= SLOW_INVOCATION_S:
                log.warning(
                    "slow request %s",
                    json.dumps(
                        {
                            "function": function_name,
                            "request": request,
                            "waited_s": round(waited, 2),
                            "ran_s": round(measured, 2),
                        }
                    ),
                )
            self._current.reset(token)
            with self._lock:
                self._idle.setdefault(function_name, []).append(sandbox)
            self.note_longest(function_name, measured)
            self._bill(function_name, module_name, invocation, measured)

    def note_longest(self, name: str, seconds: float) -> None:
        with self._lock:
            if seconds > self.longest_s.get(name, 0.0):
                self.longest_s[name] = seconds

    def _bill(
        self, function_name: str, module_name: str, invocation: Invocation, measured_s: float
    ) -> None:
        profile = self.profiles.get(function_name) or FunctionProfile(
            module_name.rpartition(".")[2], DEFAULT_MEMORY_MB
        )
        model_s, slept_s = invocation.scaled_s()
        billing.METER.lambda_invocation(
            profile.label,
            profile.memory_mb,
            measured_s,
            model_s=model_s,
            slept_s=slept_s,
            waited_s=slept_s + invocation.drawing_s,
            architecture=profile.architecture,
            cold_start=module_name if invocation.cold else None,
        )

    def _acquire(self, function_name: str, module_name: str) -> tuple[ModuleType, bool]:
        """An idle sandbox of the function, or a cold start (True): a fresh copy of the handler
        module, so its module-level state (Powertools' batch processor and resolver, the wiring
        cache) serves one invocation at a time, as a Lambda execution environment does."""
        with self._lock:
            self.invocations[function_name] += 1
            idle = self._idle.setdefault(function_name, [])
            if idle:
                return idle.pop(), False
            self.invocations[f"cold_starts:{function_name}"] += 1
            self._sandboxes += 1
            unique = f"{module_name}__sandbox{self._sandboxes}"
        spec = importlib.util.find_spec(module_name)
        if spec is None or spec.origin is None:
            raise ImportError(f"no handler module {module_name}")
        copy_spec = importlib.util.spec_from_file_location(unique, spec.origin)
        assert copy_spec is not None and copy_spec.loader is not None
        module = importlib.util.module_from_spec(copy_spec)
        sys.modules[unique] = module
        copy_spec.loader.exec_module(module)
        return module, True


#: an API invocation that waited (for the API's one-at-a-time lock) and ran this long is logged
#: (``slow request``): the local stack is one process, and a stall of its API is read from its log
SLOW_INVOCATION_S = 10.0


def _request_line(event: Any) -> str | None:
    """An API proxy event's ``METHOD path`` (None for any other event)."""
    if isinstance(event, dict) and "httpMethod" in event:
        return f"{event.get('httpMethod')} {event.get('path')}"
    return None


#: Handlers whose framework keeps per-request state at class level, shared by every sandbox of
#: this process: Powertools' REST resolver sets ``BaseRouter.current_event`` on the class, so two
#: concurrent API invocations would read each other's request (identity, headers, body). On AWS
#: each execution environment is its own process; here these handlers run one at a time.
SERIALIZED: dict[str, threading.Lock] = {"functions.api": threading.Lock()}

_HOST: list[FunctionHost] = []
_ORIGINALS: dict[str, Any] = {}


def host() -> FunctionHost | None:
    return _HOST[0] if _HOST else None


def install(function_host: FunctionHost, process_env: Mapping[str, str]) -> None:
    """Route moto's Lambda Invoke to ``function_host`` and the handlers' wiring through it."""
    for name, value in process_env.items():
        os.environ[name] = value
    _HOST[:] = [function_host]
    patch_lambda_invoke()
    probe_worker_reports()
    keep_log_keys_per_invocation()
    wiring.run_on(function_host)


#: per thread (each invocation runs on its own): the keys of each Powertools formatter
_LOG_FORMATS: contextvars.ContextVar[dict[int, dict[str, Any]]] = contextvars.ContextVar(
    "swarm_local_log_formats"
)


def keep_log_keys_per_invocation() -> None:
    """Powertools keeps a logger's keys (``append_keys``, ``inject_lambda_context``'s
    ``function_name`` and request id) on its formatter, one per service name, so every sandbox
    of every function in this process shares one: concurrent invocations wrote each other's
    keys (a worker's line carried the sweeper's function name and another worker's unit id). On
    AWS each execution environment is its own process. Here each formatter's keys are kept per
    thread, as each invocation runs on a thread of its own; an invocation's first line starts
    from the formatter's own keys, as ``clear_state`` leaves them."""
    from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

    if "log-format" in _ORIGINALS:
        return
    _ORIGINALS["log-format"] = LambdaPowertoolsFormatter.__dict__.get("log_format")

    def formats() -> dict[int, dict[str, Any]]:
        found = _LOG_FORMATS.get(None)
        if found is None:
            found = {}
            _LOG_FORMATS.set(found)
        return found

    def get(self: Any) -> dict[str, Any]:
        mine = formats()
        keys = mine.get(id(self))
        if keys is None:
            keys = dict.fromkeys(self.log_record_order)
            keys.update(getattr(self, "keys_combined", {}))
            mine[id(self)] = keys
        return keys

    def put(self: Any, value: dict[str, Any]) -> None:
        formats()[id(self)] = value

    LambdaPowertoolsFormatter.log_format = property(get, put)  # type: ignore[assignment]


def _current_invocation() -> Invocation | None:
    fn_host = host()
    return None if fn_host is None else fn_host.current()


#: per thread: the seconds the running ``Worker.process`` has slept for tokens so far
_SLEPT = threading.local()


def probe_worker_reports() -> None:
    """For the bill: around :meth:`Worker.process`, the spans in which the worker sleeps for
    tokens (its injected ``sleep``, the governor's wait: time-scaled) and the rest of the
    ``waited_s`` its report gives (its draws' requests), added to the running invocation.
    Observes only: the unit's processing is unchanged. The worker's ``sleep`` is wrapped once,
    not swapped per call (a worker runs its batch's messages at once, on one ``Worker``). (A
    worker whose ``sleep`` cannot be wrapped counts its whole reported wait as drawing.)"""
    from swarm.service.worker import Worker

    if "worker.process" in _ORIGINALS:
        return
    original: Callable[..., Any] = Worker.process
    _ORIGINALS["worker.process"] = original

    def measured(sleep: Callable[[float], None]) -> Callable[[float], None]:
        def sleep_metered(seconds: float) -> None:
            started = time.perf_counter()
            try:
                sleep(seconds)
            finally:
                ended = time.perf_counter()
                _SLEPT.seconds = getattr(_SLEPT, "seconds", 0.0) + ended - started
                invocation = _current_invocation()
                if invocation is not None:
                    invocation.span(SLEEP, started, ended)

        sleep_metered.metered = True  # type: ignore[attr-defined]
        return sleep_metered

    @functools.wraps(original)
    def process(
        self: Any,
        item: Any,
        first_delivery: bool = True,
        invocation: Any = None,
        deadline: float | None = None,
    ) -> Any:
        unit_invocation = invocation  # the worker's (drain reading, running-work entry)
        invocation = _current_invocation()
        if invocation is None:
            return original(self, item, first_delivery, unit_invocation, deadline)
        sleep = getattr(self, "sleep", None)
        if callable(sleep) and not getattr(sleep, "metered", False):
            with contextlib.suppress(AttributeError, TypeError):  # a frozen worker: see above
                self.sleep = measured(sleep)
        _SLEPT.seconds = 0.0
        started = time.perf_counter()
        _SLOW.start(str(getattr(item, "unit_id", "?")))
        try:
            report = original(self, item, first_delivery, unit_invocation, deadline)
        finally:
            _SLOW.end()
        fn_host = host()
        if fn_host is not None:
            fn_host.note_longest(WORKER_MESSAGE, time.perf_counter() - started)
        waited = float(getattr(report, "waited_s", 0.0) or 0.0)
        invocation.add_drawing(waited - _SLEPT.seconds)
        return report

    Worker.process = process  # type: ignore[method-assign]


#: a worker message still running after these many seconds on the local clock gets its stack
#: logged at each mark (where the emulator stalls it: a claim's lease is six worker timeouts,
#: time-scaled, and the emulator's own stalls are not)
SLOW_MESSAGE_S = (5.0, 10.0, 15.0)


class _SlowMessages:
    """The worker messages running now, looked at once a second by one daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, float, int]] = {}  # thread -> unit, start, marks
        self._thread: threading.Thread | None = None

    def start(self, unit_id: str) -> None:
        with self._lock:
            self._running[threading.get_ident()] = (unit_id, time.perf_counter(), 0)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True, name="slow")
                self._thread.start()

    def end(self) -> None:
        with self._lock:
            self._running.pop(threading.get_ident(), None)

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            now, frames = time.perf_counter(), sys._current_frames()
            with self._lock:
                due = []
                for tid, (unit, started, marks) in self._running.items():
                    if marks < len(SLOW_MESSAGE_S) and now - started >= SLOW_MESSAGE_S[marks]:
                        self._running[tid] = (unit, started, marks + 1)
                        due.append((tid, unit, now - started))
            for tid, unit, after in due:
                frame = frames.get(tid)
                if frame is not None:
                    log.warning(
                        "worker message %s running for %.0f s:\n%s", unit, after, _where(frame)
                    )


_SLOW = _SlowMessages()


def _where(frame: Any) -> str:
    """A stack's frames in the project's code, then the innermost two (where it waits)."""
    frames = traceback.extract_stack(frame)
    ours = [f for f in frames[:-2] if "/swarm/" in f.filename or "/functions/" in f.filename]
    return "".join(traceback.format_list(ours + frames[-2:]))


def uninstall() -> None:
    _HOST.clear()
    wiring.run_on(None)


def _invoke(
    self: Any,
    function_name: str,
    qualifier: str | None,
    body: Any,
    headers: Any,
    response_headers: Any,
) -> bytes:
    fn_host = host()
    if fn_host is None:  # not installed: moto's behaviour
        original: Callable[..., bytes] = _ORIGINALS["invoke"]
        return original(self, function_name, qualifier, body, headers, response_headers)
    fn = self.get_function(function_name, qualifier)  # raises ResourceNotFound like AWS
    text = body.decode() if isinstance(body, bytes) else (body or "")
    event = json.loads(text) if text.strip() else {}
    env = dict(fn.environment_vars or {})
    if headers and headers.get("X-Amz-Invocation-Type") == "Event":
        thread = threading.Thread(
            target=_run_quietly,
            args=(fn_host, fn.function_name, fn.handler, env, event),
            name=f"lambda-event-{fn.function_name}",
            daemon=True,
        )
        thread.start()
        return b""
    try:
        result = fn_host.call(fn.function_name, fn.handler, env, event)
    except (Exception, *SANDBOX_DEATHS) as e:
        response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps(
            {
                "errorType": type(e).__name__,
                "errorMessage": str(e),
                "stackTrace": traceback.format_exception(e)[-5:],
            }
        ).encode()
    return json.dumps(result, ensure_ascii=False).encode()


def _run_quietly(
    fn_host: FunctionHost, name: str, handler: str, env: Mapping[str, str], event: Any
) -> None:
    try:
        fn_host.call(name, handler, env, event)
    except (Exception, *SANDBOX_DEATHS):
        log.exception("asynchronous invocation of %s failed", name)


def patch_lambda_invoke() -> None:
    from moto.awslambda_simple.models import LambdaSimpleBackend

    if "invoke" in _ORIGINALS:
        return
    _ORIGINALS["invoke"] = LambdaSimpleBackend.invoke
    LambdaSimpleBackend.invoke = _invoke  # type: ignore[method-assign]
