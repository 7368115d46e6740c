"""The simulated workload: unit sizes, per-attempt failures and service times, all seeded.

With the defaults this is exactly Lab 6.1's workload: 400 units of 8,000-16,000 tokens, a 4%
per-attempt failure rate, ``180 + tokens // 100`` seconds of worker wall clock per attempt. A
workload can also carry explicit unit sizes (a manifest's ``projected_tokens``, for ``swarm
plan``); its failures are still drawn from the seed.

A workload with a :class:`TurnModel` (``swarm sim run --turns N``) is one of *agent units*: each
unit is a loop of model turns with tool calls between them (:meth:`Workload.turn_plan`, the
growth model; :mod:`swarm.sim.agent` runs it). Without one (``--turns 1``, the default) a unit
is one draw of its tokens and one service time, as in Lab 6.1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from swarm.core.errors import InvalidInput
from swarm.core.records import UnitSpec
from swarm.core.scheduling import ServiceModel, UnitProfile, small_unit_tokens


@dataclass(frozen=True)
class Turn:
    """One model turn of an agent unit, as the growth model plans it (0-based ``turn``)."""

    turn: int
    input_tokens: int  # the conversation so far: what the model reads
    draw: int  # what the governor is asked for: the input plus the output bound
    billed: int  # what the turn bills: the input plus what the model writes
    model_s: int  # worker seconds for the model call
    tool_s: int  # worker seconds its tool calls take afterwards (0 for the last turn)


@dataclass(frozen=True)
class TurnModel:
    """How an agent unit's turns grow (docs/explanation/planner.md, "Agent units").

    Unit ``i`` makes ``n`` model turns, ``n`` drawn from ``turns_min..turns_max`` on the seed.
    Turn ``k`` (1-based) reads ``input_k = prompt + (k - 1) x (output_tokens + tool_tokens)``:
    each turn adds what the model wrote and one tool result to the conversation. It draws
    ``input_k + output_bound`` from the governor, bills ``input_k + output_tokens`` (the
    difference is trued up), holds a worker ``base_s / n + billed // tokens_per_s`` seconds for
    the model call (the unit's one-call service time spread over its turns), then, except for
    the last turn, ``tool_seconds`` for its tool calls (the worker waits for them). The
    ``prompt`` is ``prompt_tokens`` if given; else the largest that makes the whole loop fit in
    ``1 - headroom`` of the unit's cap (its projected tokens), the rest being room for lost
    turns. A turn whose draw does not fit in what is left of the cap is not called: the unit
    stops ``limit_tokens``. Between turns, a draw the governor cannot grant within
    ``hold_seconds`` sends the unit back to its lane (its worker freed) until the tokens are
    there.
    """

    turns_min: int = 1
    turns_max: int = 1
    output_bound: int = 256
    output_tokens: int = 128
    tool_tokens: int = 128
    tool_seconds: int = 5
    hold_seconds: int = 20
    prompt_tokens: int | None = None
    headroom: float = 0.1

    def __post_init__(self) -> None:
        if not 1 <= self.turns_min <= self.turns_max <= 100:
            raise InvalidInput(
                "turns", f"need 1 <= min <= max <= 100, got {self.turns_min}-{self.turns_max}"
            )
        if self.output_bound < 1:
            raise InvalidInput("output_bound", f"must be >= 1, got {self.output_bound}")
        if not 1 <= self.output_tokens <= self.output_bound:
            raise InvalidInput(
                "output_tokens",
                f"must be 1..the output bound ({self.output_bound}), got {self.output_tokens}",
            )
        for name in ("tool_tokens", "tool_seconds", "hold_seconds"):
            if getattr(self, name) < 0:
                raise InvalidInput(name, f"must be >= 0, got {getattr(self, name)}")
        if self.prompt_tokens is not None and self.prompt_tokens < 1:
            raise InvalidInput("prompt_tokens", f"must be >= 1, got {self.prompt_tokens}")
        if not 0 <= self.headroom < 1:
            raise InvalidInput("headroom", f"must be in [0, 1), got {self.headroom}")

    @property
    def agent(self) -> bool:
        """Units are loops of turns (else one draw and one service time, as in Lab 6.1)."""
        return self.turns_max > 1

    def loop_overhead(self, n: int) -> int:
        """Tokens an ``n``-turn loop needs beyond ``n`` prompts: its growth and the last
        turn's output bound (the last turn is drawn, not billed, when the cap is checked)."""
        o, g = self.output_tokens, self.output_tokens + self.tool_tokens
        return (n - 1) * o + g * n * (n - 1) // 2 + self.output_bound


#: one model call per unit, as in Lab 6.1
ONE_CALL = TurnModel()


@dataclass(frozen=True)
class Workload:
    units: int = 400
    min_tokens: int = 8_000
    max_tokens: int = 16_000
    failure_rate: float = 0.04
    seed: int = 0
    service: ServiceModel = field(default_factory=ServiceModel)
    sizes: tuple[int, ...] = ()  # explicit unit sizes (a manifest); else drawn from the seed
    ids: tuple[str, ...] = ()  # their unit ids (default unit-00000, unit-00001...)
    turns: TurnModel = ONE_CALL  # agent units: loops of turns (swarm.sim.agent)

    def __post_init__(self) -> None:
        if self.units < 1:
            raise InvalidInput("units", f"must be >= 1, got {self.units}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise InvalidInput(
                "tokens", f"need 1 <= min <= max, got {self.min_tokens}..{self.max_tokens}"
            )
        if not 0 <= self.failure_rate < 1:
            raise InvalidInput("failure_rate", f"must be in [0, 1), got {self.failure_rate}")
        if self.sizes and (
            len(self.sizes) != self.units
            or min(self.sizes) != self.min_tokens
            or max(self.sizes) != self.max_tokens
        ):
            raise InvalidInput("sizes", "build a workload of explicit sizes with from_sizes")
        if self.ids and len(self.ids) != self.units:
            raise InvalidInput("ids", f"need one id per unit, got {len(self.ids)} for {self.units}")

    @classmethod
    def from_sizes(
        cls,
        sizes: Sequence[int],
        ids: Sequence[str] = (),
        failure_rate: float = 0.04,
        seed: int = 0,
        service: ServiceModel | None = None,
        turns: TurnModel = ONE_CALL,
    ) -> Workload:
        """A workload of given unit sizes (e.g. a manifest's ``projected_tokens``)."""
        if not sizes:
            raise InvalidInput("units", "a workload needs at least one unit")
        for index, size in enumerate(sizes):
            if not isinstance(size, int) or size < 1:
                raise InvalidInput(f"units[{index}].projected_tokens", f"must be >= 1, got {size}")
        return cls(
            units=len(sizes),
            min_tokens=min(sizes),
            max_tokens=max(sizes),
            failure_rate=failure_rate,
            seed=seed,
            service=service or ServiceModel(),
            sizes=tuple(sizes),
            ids=tuple(ids),
            turns=turns,
        )

    def unit_id(self, index: int) -> str:
        return self.ids[index] if self.ids else f"unit-{index:05d}"

    def tokens(self, index: int) -> int:
        """Token appetite of one unit (model calls, all turns)."""
        if self.sizes:
            return self.sizes[index]
        return random.Random(f"{self.seed}:{index}").randint(self.min_tokens, self.max_tokens)

    def fails(self, index: int, attempt: int) -> bool:
        """Deterministic per (unit, attempt)."""
        return random.Random(f"{self.seed}:{index}:{attempt}").random() < self.failure_rate

    def service_s(self, tokens: int) -> int:
        """Worker wall clock for one attempt (~5 minutes on average for Lab 6.1's units)."""
        return self.service.seconds(tokens)

    # ------------------------------------------------------------ agent units

    def turn_count(self, index: int) -> int:
        """Model turns unit ``index`` makes if nothing stops it (deterministic per seed)."""
        t = self.turns
        if t.turns_min == t.turns_max:
            return t.turns_min
        return random.Random(f"{self.seed}:{index}:turns").randint(t.turns_min, t.turns_max)

    def turn_fails(self, index: int, attempt: int, turn: int) -> bool:
        """Deterministic per (unit, attempt, turn): the turn is lost, billed at its draw."""
        key = f"{self.seed}:{index}:{attempt}:turn{turn}"
        return random.Random(key).random() < self.failure_rate

    def turn_plan(self, index: int) -> tuple[Turn, ...]:
        """Unit ``index``'s turns under the growth model (:class:`TurnModel`)."""
        t, n, cap = self.turns, self.turn_count(index), self.tokens(index)
        if t.prompt_tokens is not None:
            prompt = t.prompt_tokens
        else:
            fit = math.floor(cap * (1 - t.headroom))
            prompt = (fit - t.loop_overhead(n)) // n
            if prompt < 1:
                raise InvalidInput(
                    "turns",
                    f"{self.unit_id(index)}'s cap of {cap:,} tokens cannot hold {n} turns: their "
                    f"growth alone needs {t.loop_overhead(n):,} tokens and the loop may use "
                    f"{fit:,} ({1 - t.headroom:.0%} of the cap); give larger units "
                    "(--min-tokens), fewer turns, smaller --output-tokens/--tool-tokens, or "
                    "--prompt-tokens to let such units stop limit_tokens",
                )
        growth = t.output_tokens + t.tool_tokens
        base = self.service.base_s
        turns = []
        for k in range(n):
            input_tokens = prompt + k * growth
            billed = input_tokens + t.output_tokens
            share = base // n + (base % n if k == 0 else 0)
            turns.append(
                Turn(
                    turn=k,
                    input_tokens=input_tokens,
                    draw=input_tokens + t.output_bound,
                    billed=billed,
                    model_s=max(1, share + billed // self.service.tokens_per_s),
                    tool_s=t.tool_seconds if k < n - 1 else 0,
                )
            )
        return tuple(turns)

    def held_s(self, index: int) -> int:
        """Worker seconds unit ``index``'s loop holds when nothing waits or fails: its model
        time plus its tools' time (its one-call service time without turns)."""
        if not self.turns.agent:
            return self.service_s(self.tokens(index))
        return sum(turn.model_s + turn.tool_s for turn in self.turn_plan(index))

    def appetite(self, index: int) -> int:
        """Tokens unit ``index`` bills when nothing fails (its projected tokens without turns;
        with ``--prompt-tokens``, only the turns that fit its cap)."""
        if not self.turns.agent:
            return self.tokens(index)
        cap, billed = self.tokens(index), 0
        for turn in self.turn_plan(index):
            if billed + turn.draw > cap:
                break
            billed += turn.billed
        return billed

    def specs(self) -> tuple[UnitSpec, ...]:
        return tuple(UnitSpec(self.unit_id(i), self.tokens(i)) for i in range(self.units))

    @cached_property
    def _index(self) -> dict[str, int]:
        return {self.unit_id(i): i for i in range(self.units)}

    def index_of(self, unit_id: str) -> int:
        return self._index[unit_id]

    @cached_property
    def all_tokens(self) -> tuple[int, ...]:
        return tuple(self.tokens(i) for i in range(self.units))

    @property
    def first_attempt_tokens(self) -> int:
        """Tokens the units bill when nothing fails (agent units: their loops' appetites)."""
        if not self.turns.agent:
            return sum(self.all_tokens)
        return sum(self.appetite(i) for i in range(self.units))

    def profile(self) -> UnitProfile:
        """The unit profile a fleet is sized for (:func:`swarm.core.scheduling.size_fleet`):
        an agent unit's tokens are its loop's appetite and its seconds every second its loop
        holds a worker, model calls and tool calls."""
        if not self.turns.agent:
            return UnitProfile.of(self.all_tokens, self.service)
        appetites = [self.appetite(i) for i in range(self.units)]
        held = [self.held_s(i) for i in range(self.units)]
        if min(appetites) < 1:
            raise InvalidInput(
                "prompt_tokens",
                "some units' caps cannot pay for their first turn: raise their tokens or lower "
                "--prompt-tokens",
            )
        small = small_unit_tokens(appetites)
        return UnitProfile(
            mean_tokens=sum(appetites) / len(appetites),
            mean_seconds=sum(held) / len(held),
            small_tokens=small,
            small_seconds=max(h for a, h in zip(appetites, held, strict=True) if a == small),
        )

    def with_seed(self, seed: int) -> Workload:
        """The same workload with another seed: other sizes (unless explicit), turns and
        failures."""
        return replace(self, seed=seed)
