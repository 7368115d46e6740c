"""BFCL's multi-turn tasks as agent units, and BFCL's own state comparison as their oracle.

The Berkeley Function Calling Leaderboard (PyPI ``bfcl-eval``, Apache-2.0) ships multi-turn
tasks whose tools are plain Python backends (a file system, messaging, posting, tickets, trading,
travel, vehicle control, math), each entry with its user turns, the backends' initial state and a
ground truth: the calls each user turn should make. Here:

* :func:`unit_input` turns an entry into an agent unit's input (swarm.core.agent): its first user
  turn as the request, the later ones as ``followUps``, its tools from its classes' function docs
  (converted to Converse toolSpecs, :func:`tool_of`), ``max_turns`` enough for its ground truth;
* :class:`ScriptedModel` replays the entry's ground truth as a Converse model would answer: a
  pure function of the request, one model turn with every call of a user turn's ground-truth
  group as toolUse blocks, then an ``end_turn`` answer;
* :class:`Backends` serves the calls on the entry's backends, one state per unit, kept durably as
  the unit's *journal* (each call that ran, under its idempotency key, with its outcome): a
  second call with a key already in the journal answers the first outcome and has no second
  effect, and any process rebuilds the unit's state by replaying the journal on fresh backends
  (:meth:`Backends.instances`);
* :func:`judge` compares a unit's final state with the state its ground truth produces when BFCL
  executes it directly (``execute_multi_turn_func_call``), with BFCL's ``state_checker``. A tool
  run twice or lost changes that state: it is the at-most-once oracle.

Only BFCL's multi-turn backends and data are used: install it with ``pip install --no-deps
bfcl-eval`` (and ``mpmath``), not its whole dependency tree (``make setup`` does).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final, Protocol

from bfcl_eval.constants.executable_backend_config import (
    CLASS_FILE_PATH_MAPPING,
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    STATELESS_CLASSES,
)
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker

from swarm.core import agent
from swarm.core.agent import AgentSpec, Tool, ToolCall, ToolOutcome
from swarm.core.agent_driver import (
    Killed,
    KillHook,
    LogStore,
    LoopRunner,
    TurnBooks,
    log_key,
    never,
)
from swarm.core.clock import Clock
from swarm.core.errors import Contended, InvalidInput

CATEGORIES: Final = ("multi_turn_base",)
#: JSON Schema's names for BFCL's parameter types
TYPES: Final = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}
#: each user turn's answer takes a model turn, and one more when its group calls tools; this
#: many more are allowed for turns lost to crashes
SPARE_TURNS: Final = 10
OUTPUT_BOUND: Final = 512
#: the token cap of a BFCL unit: far above what its turns bill
PROJECTED_TOKENS: Final = 400_000
#: the BFCL tool source's declarations in this repository (and the functions' asset), written by
#: ``python -m swarm.workloads.bfcl --write-declarations``
DECLARATIONS_FILE: Final = "functions/tools/bfcl.tools.json"
#: the units whose backends a process keeps between calls (a warm tool function's memory)
MAX_CACHED_UNITS: Final = 64
#: how many times a call is run again on a journal another process moved meanwhile
MAX_JOURNAL_TRIES: Final = 20


def data_dir() -> str:
    import bfcl_eval

    return os.path.join(os.path.dirname(bfcl_eval.__file__), "data")


@dataclass(frozen=True)
class Entry:
    """One BFCL multi-turn entry with its ground truth."""

    id: str
    user_turns: tuple[str, ...]
    initial_config: dict[str, Any]
    classes: tuple[str, ...]
    excluded: tuple[str, ...]
    ground_truth: tuple[tuple[str, ...], ...]


def entries(category: str = "multi_turn_base", limit: int | None = None) -> list[Entry]:
    """The category's entries in file order (the first ``limit``)."""
    if category not in CATEGORIES:
        raise InvalidInput("category", f"{category!r} is not served; use {', '.join(CATEGORIES)}")
    name = f"BFCL_v4_{category}.json"
    questions = _json_lines(os.path.join(data_dir(), name))
    answers = {a["id"]: a for a in _json_lines(os.path.join(data_dir(), "possible_answer", name))}
    out = []
    for q in questions[:limit]:
        turns = []
        for index, turn in enumerate(q["question"]):
            if [m.get("role") for m in turn] != ["user"]:
                raise InvalidInput(f"{q['id']}.question[{index}]", "must be one user message")
            turns.append(str(turn[0]["content"]))
        out.append(
            Entry(
                id=q["id"],
                user_turns=tuple(turns),
                initial_config=q["initial_config"],
                classes=tuple(q["involved_classes"]),
                excluded=tuple(q.get("excluded_function") or ()),
                ground_truth=tuple(tuple(g) for g in answers[q["id"]]["ground_truth"]),
            )
        )
    return out


def _json_lines(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------ tools


def schema_of(parameters: Any) -> Any:
    """BFCL's parameter schema as JSON Schema: its ``dict``/``float``/``tuple``/``any`` types
    renamed, everything else kept."""
    if isinstance(parameters, dict):
        out = {k: schema_of(v) for k, v in parameters.items()}
        if isinstance(parameters.get("type"), str):
            out["type"] = TYPES.get(parameters["type"], parameters["type"])
        if "properties" in parameters:
            out["properties"] = {k: schema_of(v) for k, v in parameters["properties"].items()}
        return out
    if isinstance(parameters, list):
        return [schema_of(v) for v in parameters]
    return parameters


def tool_of(doc: Mapping[str, Any]) -> Tool:
    """A BFCL function doc as a Converse tool."""
    return agent.check_tool(
        Tool(str(doc["name"]), str(doc["description"]), schema_of(doc["parameters"])),
        f"bfcl.{doc['name']}",
    )


@cache
def class_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    path = os.path.join(
        data_dir(), "multi_turn_func_doc", MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    )
    return tuple(_json_lines(path))


def tools_of(entry: Entry) -> dict[str, Tool]:
    """The entry's tools: its classes' functions but those it excludes, by name."""
    tools: dict[str, Tool] = {}
    for class_name in entry.classes:
        for doc in class_docs(class_name):
            if doc["name"] in entry.excluded:
                continue
            if doc["name"] in tools:
                raise InvalidInput(f"{entry.id}.tools", f"two classes define {doc['name']!r}")
            tools[doc["name"]] = tool_of(doc)
    return tools


def unit_id(entry: Entry) -> str:
    return entry.id.replace("_", "-")


def unit_input(entry: Entry) -> dict[str, Any]:
    """The entry as an agent unit's input (swarm.core.agent's contract)."""
    needed = sum(2 if group else 1 for group in entry.ground_truth)
    return {
        "messages": [{"role": "user", "content": [{"text": entry.user_turns[0]}]}],
        "inferenceConfig": {"maxTokens": OUTPUT_BOUND},
        "tools": list(tools_of(entry)),
        "followUps": list(entry.user_turns[1:]),
        "limits": {"max_turns": min(agent.MAX_TURNS, needed + SPARE_TURNS)},
    }


def unit_spec(entry: Entry, batch: str) -> AgentSpec:
    return agent.parse_agent_input(
        unit_input(entry),
        batch=batch,
        unit=unit_id(entry),
        projected_tokens=PROJECTED_TOKENS,
        registry=tools_of(entry),
    )


# ------------------------------------------------------------------ the scripted model


def parse_call(call: str, entry: Entry) -> tuple[str, dict[str, Any]]:
    """A ground-truth call (``"mv(source='a', destination='b')"``) as a tool name and its
    input, positional arguments named from the backend method's signature."""
    tree = ast.parse(call.strip(), mode="eval").body
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Name):
        raise InvalidInput(f"{entry.id}.ground_truth", f"{call!r} is not a plain function call")
    name = tree.func.id
    args = [ast.literal_eval(a) for a in tree.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in tree.keywords if k.arg is not None}
    method = getattr(_class_of(entry, name), name)
    bound = inspect.signature(method).bind(None, *args, **kwargs)  # None: self
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(inspect.signature(method).parameters)))
    return name, json.loads(json.dumps(arguments))


def _class_of(entry: Entry, method: str) -> type:
    for class_name in entry.classes:
        cls = _backend_class(class_name)
        if callable(getattr(cls, method, None)) and not method.startswith("_"):
            return cls
    raise InvalidInput(f"{entry.id}.ground_truth", f"no class of the entry has {method!r}")


@cache
def _backend_class(class_name: str) -> type:
    module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    cls: type = getattr(module, class_name)
    return cls


@dataclass
class ScriptedModel:
    """A Converse model replaying one entry's ground truth, a pure function of the request:
    after user turn i (counted from the request's user text messages), the first answer asks
    for every call of ground-truth group i (toolUse ids ``c<i>-<j>``), the next ends the turn
    (a group without calls is answered at once). Its usage: the request's estimated tokens
    (part of them as cache reads and writes) and its answer's."""

    entry: Entry
    calls: int = 0
    billed: int = 0
    log: list[tuple[int, int]] = field(default_factory=list)  # (user turn, position) per call

    def __call__(self, request: dict[str, Any]) -> Mapping[str, Any]:
        problem = agent.request_problem(request)
        if problem is not None:  # what Bedrock would refuse
            raise InvalidInput("request", problem)
        messages = request["messages"]
        texts = [i for i, m in enumerate(messages) if m["role"] == "user" and _is_text(m)]
        turn, since = len(texts) - 1, len(messages) - 1 - texts[-1]
        group = self.entry.ground_truth[turn]
        content: list[dict[str, Any]]
        if since == 0 and group:
            content = [{"text": f"Working on request {turn + 1}."}]
            for j, call in enumerate(group):
                name, arguments = parse_call(call, self.entry)
                content.append(
                    {"toolUse": {"toolUseId": f"c{turn}-{j}", "name": name, "input": arguments}}
                )
            stop = "tool_use"
        else:
            content, stop = [{"text": f"Request {turn + 1} is done."}], "end_turn"
        total = agent.estimate_tokens({k: v for k, v in request.items() if k != "inferenceConfig"})
        read, write = total // 2, total // 10
        output = min(agent.estimate_tokens(content), request["inferenceConfig"]["maxTokens"])
        usage = {
            "inputTokens": total - read - write,
            "outputTokens": output,
            "cacheReadInputTokens": read,
            "cacheWriteInputTokens": write,
        }
        self.calls += 1
        self.billed += agent.billed_of(usage)
        self.log.append((turn, since))
        return {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop,
            "usage": usage,
        }


def _is_text(message: Mapping[str, Any]) -> bool:
    return any("text" in block for block in message["content"])


# ------------------------------------------------------------------ the backends


@dataclass
class MemoryJournals:
    """Each unit's journal, durably (in memory here; S3 or DynamoDB on the stack): appended on
    the condition that it still has the length the caller read."""

    journals: dict[str, list[str]] = field(default_factory=dict)  # each call as its JSON

    def read(self, unit: str) -> list[dict[str, Any]]:
        return [json.loads(done) for done in self.journals.get(unit, [])]

    def append(self, unit: str, seq: int, entry: dict[str, Any]) -> None:
        journal = self.journals.setdefault(unit, [])
        if len(journal) != seq:
            raise Contended(f"journal of {unit!r} holds {len(journal)} calls, not {seq}")
        journal.append(json.dumps(entry, allow_nan=False))


@dataclass
class Backends:
    """The tool executor of one process for BFCL units: a unit's backends are rebuilt from its
    journal (kept in this process while the journal does not move), and each call runs at most
    once per idempotency key."""

    entry: Entry
    unit: str
    journals: Journals
    #: the calls this process ran and journaled (journal replays, and runs another process
    #: journaled first, apart)
    ran: int = 0
    #: the calls answered from the journal: run before (by a process that died before the
    #: loop recorded the result, or by a stale duplicate)
    repeats: int = 0
    _cached: tuple[int, dict[str, Any]] | None = None

    def __call__(self, call: ToolCall) -> ToolOutcome:
        for _ in range(MAX_JOURNAL_TRIES):
            journal = self.journals.read(self.unit)
            for done in journal:
                if done["key"] == call.key:  # ran before: the first outcome, no second effect
                    self.repeats += 1
                    return ToolOutcome(done["status"], done["value"])
            instances = self.instances(journal)
            self._cached = None  # the instances change now; kept again once the journal holds it
            status, value = _run(instances, call.name, call.input)
            record = {"key": call.key, "name": call.name, "input": call.input}
            try:
                self.journals.append(
                    self.unit, len(journal), {**record, "status": status, "value": value}
                )
            except Contended:  # another process journaled first: this run's state is void
                continue
            self.ran += 1
            self._cached = (len(journal) + 1, instances)
            return ToolOutcome(status, value)
        raise Contended(f"{self.unit}: the journal kept moving ({MAX_JOURNAL_TRIES} tries)")

    def instances(self, journal: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """The unit's backends as its journal leaves them: fresh from the entry's initial
        configuration, every journaled call replayed once, in order."""
        journal = self.journals.read(self.unit) if journal is None else journal
        if self._cached is not None and self._cached[0] == len(journal):
            return self._cached[1]
        instances = fresh_instances(self.entry)
        for done in journal:
            _run(instances, done["name"], done["input"])
        self._cached = (len(journal), instances)
        return instances


class Journals(Protocol):
    """Each unit's journal of tool calls, durably, appended on its length (MemoryJournals; a
    DynamoDB table on the stack)."""

    def read(self, unit: str) -> list[dict[str, Any]]: ...

    def append(self, unit: str, seq: int, entry: dict[str, Any]) -> None: ...


@cache
def entries_by_unit(category: str = "multi_turn_base") -> dict[str, Entry]:
    """The category's entries by their unit id (:func:`unit_id`)."""
    return {unit_id(entry): entry for entry in entries(category)}


@cache
def all_tools(category: str = "multi_turn_base") -> dict[str, Tool]:
    """Every function of the backend classes the category's entries use, as a tool by name."""
    tools: dict[str, Tool] = {}
    for class_name in sorted({c for entry in entries(category) for c in entry.classes}):
        for doc in class_docs(class_name):
            tool = tools.setdefault(doc["name"], tool_of(doc))
            if tool != tool_of(doc):
                raise InvalidInput(f"{category}.tools", f"two classes define {doc['name']!r}")
    return tools


def declarations(category: str = "multi_turn_base") -> dict[str, dict[str, Any]]:
    """Every tool of the category as a tool source declares its tools (functions/tools/, the
    file ``bfcl.tools.json`` beside ``bfcl.py``: :data:`DECLARATIONS_FILE`). Each is a
    ``write`` tool: the calls of a unit share its backends' one state, so they run in the
    model's order, each at most once per idempotency key."""
    return {
        name: {
            "description": tool.description,
            "input_schema": tool.input_schema,
            "effect": "write",
        }
        for name, tool in all_tools(category).items()
    }


def declarations_text(category: str = "multi_turn_base") -> str:
    """:func:`declarations` as the file holds them (sorted, one level of indent)."""
    return json.dumps(declarations(category), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@dataclass
class BfclTools:
    """BFCL's backends as the deployment's tools (:class:`swarm.core.ports.ToolRunner`): every
    function of every class, each call run on its unit's backends at most once per idempotency
    key, the state kept in the unit's journal (``journals``: durable on the stack). A unit is
    found by the key's unit id (``batch/unit/toolUseId``); calls run in the model's order (the
    backends share one state per unit)."""

    journals: Journals
    timeout: float = 10.0
    category: str = "multi_turn_base"
    _backends: dict[str, tuple[Backends, threading.Lock]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def specs(self) -> Mapping[str, Tool]:
        return all_tools(self.category)

    def timeout_s(self, name: str) -> float:
        return self.timeout

    def in_order(self, name: str) -> bool:
        return True

    def run(self, call: ToolCall, tenant: str) -> ToolOutcome:
        batch, unit, _ = call.key.split("/", 2)
        entry = entries_by_unit(self.category).get(unit)
        if entry is None:
            return ToolOutcome("error", f"unit {unit!r} is not a BFCL {self.category} entry")
        with self._lock:
            key = f"{batch}/{unit}"
            if key not in self._backends:
                if len(self._backends) >= MAX_CACHED_UNITS:  # the oldest's is rebuilt if needed
                    del self._backends[next(iter(self._backends))]
                self._backends[key] = (Backends(entry, key, self.journals), threading.Lock())
            backends, lock = self._backends[key]
        # one call of a unit at a time in this process: they share its cached backends (another
        # process's run of the same journal position is refused by the journal itself)
        with lock:
            return backends(call)


def fresh_instances(entry: Entry) -> dict[str, Any]:
    """The entry's backends in their initial state (as BFCL's executor loads them)."""
    instances: dict[str, Any] = {}
    for class_name in entry.classes:
        instance = _backend_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry.initial_config.get(class_name, {}))
            instance._load_scenario(config, long_context=False)
        instances[class_name] = instance
    return instances


def _run(instances: Mapping[str, Any], name: str, arguments: Any) -> tuple[str, Any]:
    """Run one call on the backends: (status, JSON value), an exception as an error whose text
    is BFCL's own (``Error during execution: ...``)."""
    method = next(
        (getattr(i, name) for i in instances.values() if callable(getattr(i, name, None))), None
    )
    if method is None or name.startswith("_"):
        return "error", f"Error during execution: no backend has {name!r}"
    try:
        result = method(**arguments)
    except Exception as e:  # a backend's failure is the model's to read
        return "error", f"Error during execution: {e}"
    if isinstance(result, dict):
        try:
            return "success", json.loads(json.dumps(result, allow_nan=False))
        except (TypeError, ValueError):
            return "success", str(result)
    return "success", result if isinstance(result, str) else str(result)


# ------------------------------------------------------------------ the oracle


def ground_truth_instances(entry: Entry) -> dict[str, Any]:
    """The state the entry's ground truth produces when BFCL's own executor runs it directly,
    user turn by user turn."""
    model_name = f"swarm_oracle_{uuid.uuid4().hex}"
    instances: dict[str, Any] = {}
    try:
        for group in entry.ground_truth:
            _, instances = multi_turn_utils.execute_multi_turn_func_call(
                list(group), entry.initial_config, list(entry.classes), model_name, entry.id
            )
        if not instances:  # no call at all: the initial state
            instances = fresh_instances(entry)
    finally:  # BFCL keeps its instances in its module's globals, by model name
        for name in [n for n in vars(multi_turn_utils) if n.startswith(model_name)]:
            del vars(multi_turn_utils)[name]
    return instances


def judge(entry: Entry, final: Mapping[str, Any]) -> dict[str, Any]:
    """BFCL's state comparison of a unit's final backends with its ground truth's:
    ``{"valid": True}`` or BFCL's error with the differences."""
    result: dict[str, Any] = state_checker(dict(final), ground_truth_instances(entry))
    return result


def judge_journal(entry: Entry, journal: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """BFCL's verdict on a unit whose tool journal (as the stack's journals table holds it:
    every call its backends ran, in order) is ``journal``: its backends rebuilt from the journal
    alone, compared with its ground truth's."""
    journals = MemoryJournals({"unit": [json.dumps(done) for done in journal]})
    return judge(entry, Backends(entry, "unit", journals).instances())


def iter_specs(batch: str, category: str, limit: int | None) -> Iterator[tuple[Entry, AgentSpec]]:
    for entry in entries(category, limit):
        yield entry, unit_spec(entry, batch)


# ------------------------------------------------------------------ in memory, with crashes


@dataclass
class UnitRun:
    """What running one entry's unit in memory took."""

    entry: Entry
    spec: AgentSpec
    end: agent.Finished
    log: list[agent.Event]
    kills: int = 0
    zombies_refused: int = 0  # stale workers whose record the log refused
    tool_runs: int = 0  # calls run on the backends, every process (journal replays apart)
    tool_repeats: int = 0  # calls answered from the journal by their idempotency key
    model: ScriptedModel | None = None
    verdict: dict[str, Any] = field(default_factory=dict)


def run_in_memory(
    entry: Entry,
    batch: str,
    store: LogStore,
    books: TurnBooks,
    journals: MemoryJournals,
    clock: Clock,
    kill: KillHook = never,
    zombies: bool = True,
) -> UnitRun:
    """Run an entry's unit through the in-memory loop until it stops, a new worker (a new
    process: its own backends, rebuilt from the journal) after each kill ``kill`` asks for; with
    ``zombies``, the killed worker's last step is also carried out again from the log it was
    decided on, as a stale duplicate would (the log refuses its records once it moved); then a
    duplicate delivery of the stopped unit. Then BFCL's judge of the final state."""
    spec = unit_spec(entry, batch)
    model = ScriptedModel(entry)
    run = UnitRun(entry, spec, agent.Finished("", "", ""), [], model=model)
    processes: list[Backends] = []

    def worker(hook: KillHook = never) -> LoopRunner:
        processes.append(Backends(entry, spec.unit, journals))
        return LoopRunner(spec, store, model, processes[-1], books, clock, hook)

    while True:
        current = worker(kill)
        try:
            run.end = current.run()
            break
        except Killed:
            run.kills += 1
            if zombies and current.decided is not None:
                stale_log, stale_step = current.decided
                try:
                    worker().advance(stale_log, stale_step)
                except Contended:
                    run.zombies_refused += 1
    calls = model.calls
    again = worker().run()  # a duplicate delivery of a stopped unit does nothing
    if again != run.end or model.calls != calls:
        raise AssertionError(f"{spec.unit}: a duplicate delivery did something")
    run.log = store.read(log_key(spec))
    run.tool_runs = sum(p.ran for p in processes)
    run.tool_repeats = sum(p.repeats for p in processes)
    final = Backends(entry, spec.unit, journals).instances()  # rebuilt from the journal alone
    run.verdict = judge(entry, final)
    return run


def _positive(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of entries, at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m swarm.workloads.bfcl [--limit N] [--kills]``: run the entries through the
    in-memory loop (``--kills``: two kills per unit, rotating over the points of a turn, with
    stale duplicates) and print the verdicts, the books and the time taken."""
    import argparse
    import time

    from swarm.core.agent_driver import KillPoint, MemoryLogStore, MemoryTurnBooks
    from swarm.core.clock import VirtualClock

    parser = argparse.ArgumentParser(
        prog="python -m swarm.workloads.bfcl",
        description="Run BFCL's multi_turn_base entries as agent units through the in-memory "
        "loop and judge each unit's final backend state against its ground truth with BFCL's "
        "own state comparison; print the verdicts, the books and the time taken.",
    )
    parser.add_argument(
        "--limit", type=_positive, default=None, help="run the first N entries (default: all 200)"
    )
    parser.add_argument(
        "--kills",
        action="store_true",
        help="kill two workers per unit, at points of a turn rotating over the units, carry out "
        "each killed worker's last step again as a stale duplicate, and resume",
    )
    parser.add_argument(
        "--write-declarations",
        metavar="FILE",
        help=f"write the BFCL tool source's declarations (every tool's description, input "
        f"schema and effect) to FILE and stop; the repository keeps them in {DECLARATIONS_FILE}",
    )
    args = parser.parse_args(argv)
    if args.write_declarations:
        with open(args.write_declarations, "w", encoding="utf-8") as f:
            f.write(declarations_text())
        print(f"{len(declarations())} tools declared in {args.write_declarations}")
        return 0
    points = list(KillPoint)
    store, books, journals = MemoryLogStore(), MemoryTurnBooks(), MemoryJournals()
    began = time.perf_counter()
    valid = kills = turns = lost = 0
    for index, entry in enumerate(entries(limit=args.limit)):
        plan = {(points[index % 5], 1 + index % 3), (points[(index + 2) % 5], 2 + index % 4)}

        def kill(point: KillPoint, turn: int, plan: set[tuple[KillPoint, int]] = plan) -> bool:
            if args.kills and (point, turn) in plan:
                plan.discard((point, turn))
                return True
            return False

        run = run_in_memory(entry, "bfcl", store, books, journals, VirtualClock(), kill)
        valid += bool(run.verdict.get("valid"))
        kills += run.kills
        state = agent.read_log(run.log)
        turns += len(state.turns)
        lost += sum(1 for t in state.turns if t.message is None)
        if not run.verdict.get("valid"):
            print(f"{entry.id}: {run.end.reason}: {run.verdict.get('error_message')}")
    took = time.perf_counter() - began
    total = len(entries(limit=args.limit))
    print(
        f"{valid}/{total} final states equal to BFCL's ground truth; {turns} model turns "
        f"({lost} lost), {kills} kills, {books.duplicates} repeated settlements not billed; "
        f"{sum(books.billed.values()):,} tokens billed; {took:.1f} s"
    )
    return 0 if valid == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
