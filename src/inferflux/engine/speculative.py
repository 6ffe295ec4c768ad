"""Speculative decoding: n-gram (prompt-lookup) drafts, the acceptance rule, adaptivity.

Owns: `NgramIndex` (a request's own prompt and output, indexed so the longest recent
suffix of 4..2 tokens finds its previous occurrence in O(1)), `accept`/`residual` (the
rejection-sampling rule for a stochastic draft), `AcceptanceTracker` (per-request rolling
acceptance with pause and probe), and `NgramProposer`, the scheduler's `DraftProposer`:
which decoding requests get a draft this step, and how long. Does not own verification
(engine/spec_verify.py: sampling the target rows) or the KV (EngineCore trims it).
Pure logic: no llama.cpp. Thread rule: the engine thread only.

Why verification keeps the output distribution (docs/speculative.md has the long form).
An n-gram draft is deterministic: its q is one-hot on the drafted token x. The standard
rule accepts x with probability min(1, p(x)/q(x)) = p(x), and on rejection samples from
norm(max(0, p - q)) = p with x removed. "Sample the target at this position and accept
while the sample equals x" gives x with probability p(x) and any other y with
p(y) = (1 - p(x)) · p(y)/(1 - p(x)): the same law. So EngineCore samples each verified row
with the request's own sampler chain and emits every sampled token (the one at the first
mismatch too); no token is ever sampled and then thrown away, so the chain's state
(penalty history, DRY, the RNG, the grammar matcher) sees exactly the tokens it would have
seen without speculation, and seeded or greedy outputs match token for token (up to the
floating-point effect of a different batch shape on the logits).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from inferflux.scheduler import Request, RequestId

NGRAM_MAX = 4  # longest suffix looked up
NGRAM_MIN = 2  # shortest (a 1-gram match is mostly chance in free text: measured)
MATCH_CAP = 32  # match lengths are measured up to this
LOOKUP_SCAN = 8  # the most recent occurrences of a suffix a lookup compares


def match_prior(length: int) -> float:
    """Expected per-token acceptance of a draft whose context matched `length` tokens,
    before anything was measured: 1 - 1/length (4 → 0.75, 8 → 0.875, 32 → 0.97). Free
    text repeats 2–5-token phrases by chance; copying matches long stretches
    (bench/speculative.py). `MatchPrior` learns the real rates per worker."""
    return 1.0 - 1.0 / max(length, 1)


MATCH_BUCKETS = (2, 3, 4, 5, 6, 8, 12, 16, 24, 32)  # lower bounds of match lengths


@dataclass(slots=True)
class MatchPrior:
    """Per-token acceptance of drafts by the length of their match, learned from every
    verification of one worker (its model, its traffic), starting from `match_prior`.

    Each bucket keeps decayed counts of hits and misses (a window of about
    1 / (1 - decay) verified positions) beside the prior, worth `strength` positions:
    rate = (strength × prior + hits) / (strength + positions). Position i of a draft made
    at an L-token match is learned (`record`) and read (`along`) at match length L + i.
    Why counts with a long window: copying is accepted at 0.97-1.0 a position, and a
    short exponential average (the first version: 10 positions) cannot hold such a rate.
    The one miss that ends every copied stretch dropped it to 0.9, the gate then drafted
    10 tokens instead of 32, and which stretch ended last decided a run's speed (Gemma 3
    quote at c = 1: 84-99 tok/s over three rounds; 105-107 now). A bucket the goodput
    gate keeps turning down would never be measured, so every `explore_every`-th
    turned-down draft of a bucket is made anyway, `explore_tokens` long (a bounded cost:
    `docs/speculative.md`)."""

    decay: float = 0.99  # weight of the history per verified position
    strength: float = 4.0  # the prior's weight, in verified positions
    explore_every: int = 64
    explore_tokens: int = 2
    rates: list[float] = field(default_factory=lambda: [match_prior(b) for b in MATCH_BUCKETS])
    seen: list[int] = field(default_factory=lambda: [0] * len(MATCH_BUCKETS))
    _hits: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))
    _positions: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BUCKETS))
    _declined: list[int] = field(default_factory=lambda: [0] * len(MATCH_BUCKETS))

    @staticmethod
    def bucket(length: int) -> int:
        return max(0, bisect.bisect_right(MATCH_BUCKETS, length) - 1)

    def rate(self, length: int) -> float:
        return self.rates[self.bucket(length)]

    def along(self, length: int, k: int) -> list[float]:
        """The acceptance of each position of a k-token draft at a `length`-token match:
        once position i is accepted the match is length + i + 1 tokens long, so each
        position has the rate of its own match length (a copy that held for a while is
        likelier to hold on)."""
        return [self.rates[self.bucket(min(length + i, MATCH_CAP))] for i in range(k)]

    def explore(self, length: int) -> bool:
        """The gate turned down a draft of this match length: make it anyway this time?"""
        b = self.bucket(length)
        self._declined[b] += 1
        return self._declined[b] % self.explore_every == 0

    def record(self, length: int, drafted: int, accepted: int) -> None:
        """A draft made at a `length`-token match had its first `accepted` of `drafted`
        tokens accepted: a hit for each of those, a miss for the first rejected one,
        each in the bucket of its own match length (as `along` reads them)."""
        for i in range(accepted + (accepted < drafted)):
            self._observe(self.bucket(min(length + i, MATCH_CAP)), i < accepted)

    def _observe(self, b: int, hit: bool) -> None:
        self._hits[b] = self.decay * self._hits[b] + hit
        self._positions[b] = self.decay * self._positions[b] + 1.0
        prior = match_prior(MATCH_BUCKETS[b]) * self.strength
        self.rates[b] = (prior + self._hits[b]) / (self.strength + self._positions[b])
        self.seen[b] += 1


class NgramIndex:
    """The earlier end positions of every NGRAM_MIN..NGRAM_MAX-gram of a token list.

    `extend` appends tokens (amortised O(1) per token); `propose(k)` returns up to `k`
    tokens that followed an earlier occurrence of the longest suffix (NGRAM_MAX down to
    NGRAM_MIN tokens) of the list: of its `LOOKUP_SCAN` most recent occurrences, the one
    whose preceding tokens match the list's furthest back (`_match`), the most recent on
    a tie; continued as a repeat where it reaches the end (`_continue`). [] when no
    suffix occurred before.
    """

    def __init__(self, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN) -> None:
        self.tokens: list[int] = []
        self.n_max = n_max
        self.n_min = n_min
        # n-gram → end indices of its occurrences that are not the current suffix
        # (oldest first; the ones older than LOOKUP_SCAN are dropped from time to time)
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens`. NOTE: the n-grams ending at the last token are indexed only
        when the next token arrives, so a lookup never finds the suffix itself."""
        for token in tokens:
            self._index_end(len(self.tokens) - 1)
            self.tokens.append(token)

    def _index_end(self, end: int) -> None:
        if end < 0:
            return
        for n in range(self.n_min, self.n_max + 1):
            if end - n + 1 < 0:
                break
            key = tuple(self.tokens[end - n + 1 : end + 1])
            ends = self._ends.get(key)
            if ends is None:
                self._ends[key] = [end]
                continue
            ends.append(end)
            if len(ends) > 2 * LOOKUP_SCAN:
                del ends[:-LOOKUP_SCAN]

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the longest earlier occurrence of a suffix."""
        return self.propose_matched(k)[0]

    def propose_matched(self, k: int) -> tuple[list[int], int]:
        """`propose(k)` and how many tokens before the draft match (at most
        MATCH_CAP): a long match means the output is copying, a short one is chance."""
        tokens = self.tokens
        size = len(tokens)
        if k <= 0:
            return [], 0
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            ends = self._ends.get(tuple(tokens[size - n :]))
            if ends:
                end, length = _best_occurrence(tokens, ends[-LOOKUP_SCAN:], n)
                return _continue(tokens, end, k), length
        return [], 0


def _match(tokens: Sequence[int], end: int, n: int) -> int:
    """How many tokens up to position `end` equal the ones up to the last, counted back
    from the `n` known to match, at most MATCH_CAP."""
    last = len(tokens) - 1
    length = n
    while (
        length < MATCH_CAP and end - length >= 0 and tokens[end - length] == tokens[last - length]
    ):
        length += 1
    return length


def _best_occurrence(tokens: Sequence[int], ends: Sequence[int], n: int) -> tuple[int, int]:
    """Of the occurrences of the `n`-token suffix ending at `ends` (oldest first), the one
    whose context matches furthest back, the most recent on a tie; with that length.
    Why not simply the most recent: a document quoted twice, or a line that recurs with
    other surroundings, put a copy of the suffix nearer than the passage being copied
    (Gemma 3 quote, replayed by bench/spec_policy.py: 2.44 -> 2.72× decode speed of
    speculation off; edit 1.73 -> 1.75; chat the same)."""
    best, best_length = ends[-1], -1
    for end in reversed(ends):
        length = _match(tokens, end, n)
        if length > best_length:
            best, best_length = end, length
            if length >= MATCH_CAP:
                break
    return best, best_length


def _continue(tokens: Sequence[int], end: int, k: int) -> list[int]:
    """Up to `k` tokens that follow position `end` of `tokens`. Where that runs into the
    present (the occurrence is fewer than `k` tokens back), the draft goes on with itself:
    the output is repeating a stretch of `len(tokens) - 1 - end` tokens, and the draft
    predicts one more round of it, and another, up to `k` tokens. llama.cpp's ngram-mod
    reaches the same by chaining lookups over its own predictions. Why: Gemma 3 270M
    loops on free chat, and a draft cut at the present caught a loop of period p only p
    tokens a step (the copy-heavy replays of bench/spec_policy.py on the outputs
    spec_paired.py gets: chat 1.32 -> 2.74× decode speed of speculation off, edit
    1.19 -> 1.73, quote 1.88 -> 2.44; docs/speculative.md)."""
    draft = list(tokens[end + 1 : end + 1 + k])
    if 0 < len(draft) < k:
        period = len(draft)  # the rest of `tokens`: one round of the repeat
        draft = [draft[i % period] for i in range(k)]
    return draft


def propose_ngram(
    tokens: Sequence[int], k: int, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN
) -> list[int]:
    """Reference (quadratic) version of `NgramIndex.propose`, for tests and one-offs."""
    if k <= 0:
        return []
    size = len(tokens)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = list(tokens[size - n :])
        ends = [e for e in range(n - 1, size - 1) if list(tokens[e - n + 1 : e + 1]) == suffix]
        if ends:
            recent = ends[-LOOKUP_SCAN:]
            longest = max(_match(tokens, e, n) for e in recent)
            end = max(e for e in recent if _match(tokens, e, n) == longest)
            return _continue(tokens, end, k)
    return []


# -- the acceptance rule (stochastic drafts) -------------------------------------------
FloatArray = npt.NDArray[np.float64]


def accept(p: FloatArray, q: FloatArray, x: int, u: float) -> bool:
    """Standard speculative-sampling test: accept drafted token `x` (drawn from the draft's
    distribution `q`) under the target's `p` when u < p(x)/q(x), u uniform in [0, 1)."""
    if q[x] <= 0.0:
        return False
    return u < min(1.0, float(p[x]) / float(q[x]))


def residual(p: FloatArray, q: FloatArray) -> FloatArray:
    """Where to sample after a rejection: norm(max(0, p - q)). With q one-hot on x this is
    p with x removed, renormalised (what sampling p again and differing from x gives)."""
    diff = np.maximum(p - q, 0.0)
    total = float(diff.sum())
    return diff / total if total > 0.0 else p


def speculative_sample(p: FloatArray, q: FloatArray, x: int, u: float, v: float) -> int:
    """One position of speculative sampling: `x` if accepted, else an inverse-CDF draw
    (uniform `v`) from the residual. Its law is exactly `p` (tests/unit check it)."""
    if accept(p, q, x, u):
        return x
    cdf = np.cumsum(residual(p, q))
    return int(min(np.searchsorted(cdf, v * cdf[-1], side="right"), len(p) - 1))


# -- adaptivity ------------------------------------------------------------------------
@dataclass(slots=True)
class AcceptanceTracker:
    """A request's rolling acceptance: the chance that a drafted token is accepted given
    that the one before it was (an exponential average over verified positions: each
    accepted token is a hit, the first rejection of a draft a miss; tokens after it say
    nothing).

    Below `min_acceptance`, once `warmup` positions were seen, speculation pauses; after
    `probe_after` more generated tokens it probes again with a fresh average (REQ-12.5:
    disable under the threshold; a copy-heavy stretch later is caught again). Between
    verifications the estimate drifts back toward the prior (`recovery` per generated
    token), so a request the goodput gate stopped drafting for tries again later.
    """

    min_acceptance: float
    probe_after: int
    prior: float = 0.95  # the rate before anything was seen (match_prior caps it)
    warmup: int = 4
    decay: float = 0.8  # weight of the history per verified position
    recovery: float = 0.985  # per generated token without a verification
    rate: float = 0.95
    num_seen: int = 0
    seen_at: int = 0  # output length at the latest verification
    paused_until: int = -1  # output length at which to probe again

    def estimate(self, num_output: int) -> float:
        """The rate now, drifted toward the prior since the latest verification."""
        drift = self.recovery ** max(num_output - self.seen_at, 0)
        return self.prior - (self.prior - self.rate) * drift

    def active(self, num_output: int) -> bool:
        if num_output < self.paused_until:
            return False
        if self.paused_until >= 0:  # the pause ran out
            self.probe(num_output)
        return True

    def probe(self, num_output: int) -> None:
        """End a pause now and start over with the prior (a probe)."""
        self.paused_until, self.rate, self.num_seen = -1, self.prior, 0
        self.seen_at = num_output

    def _observe(self, hit: bool) -> None:
        self.rate = self.decay * self.rate + (1.0 - self.decay) * float(hit)
        self.num_seen += 1

    def record(self, drafted: int, accepted: int, num_output: int) -> None:
        """One verification: the first `accepted` of `drafted` tokens were accepted."""
        for _ in range(accepted):
            self._observe(True)
        if accepted < drafted:
            self._observe(False)
        self.seen_at = num_output
        if self.num_seen >= self.warmup and self.rate < self.min_acceptance:
            self.paused_until = num_output + self.probe_after


@dataclass(frozen=True, slots=True)
class StepCost:
    """Cost of a decode step of `n` logits rows, in units of a one-row step.

    `table` (measured at worker start: engine/spec_cost.py) holds the cost of 1, 2, …
    rows; past its end the cost grows by the mean per-row cost of its last four rows.
    Without a table (configured costs): 1 for one row, else 1 + second_row + extra_row ×
    (n - 2). Why a table and not a line: on these 2 CPU cores a second row doubles the
    step (the one-row path is a matrix-vector product), and past that the cost is a
    sawtooth, not a line. Gemma 3's Q4_K weights are multiplied 4 rows at a time and a
    row count that is no multiple of 4 pays for its leftover rows one by one: 8 rows cost
    3.7 one-row steps, 7 cost 5.3, 9 cost 5.0 (bench/verify_rows.py,
    docs/speculative.md). SmolLM2's Q4_1 shows a milder saw. A draft sized so that the
    step's rows are a multiple of 4 costs a third less than one a row shorter or longer.
    On a GPU all rows are near free."""

    second_row: float = 1.0
    extra_row: float = 0.4
    table: tuple[float, ...] = ()  # cost of 1, 2, ... rows (measured); () = the line

    def __call__(self, n: int) -> float:
        table = self.table
        if table:
            if n <= len(table):
                return table[max(n, 1) - 1]
            if len(table) > 4:
                return table[-1] + (table[-1] - table[-5]) / 4 * (n - len(table))
        if n <= 1:
            return 1.0
        return 1.0 + self.second_row + self.extra_row * (n - 2)


def _per_position(rate: float | Sequence[float], k: int) -> Sequence[float]:
    return [rate] * k if isinstance(rate, float | int) else rate


def expected_gain(rate: float | Sequence[float], k: int) -> float:
    """Expected accepted tokens of a k-token draft: `rate` is the per-position
    acceptance, one for all positions or one per position (position i is accepted with
    rate[i] once the ones before it were)."""
    gain, survive = 0.0, 1.0
    for r in _per_position(rate, k)[:k]:
        survive *= r
        gain += survive
    return gain


def best_draft_length(
    rate: float | Sequence[float], max_k: int, rows: int, tokens: float, cost: StepCost
) -> tuple[int, float]:
    """The draft length (0..max_k) that maximises expected tokens per unit of step cost
    for a step of `rows` rows expected to yield `tokens`; with its expected gain.
    `rate`: as in `expected_gain`. 0 when no length beats not speculating (the goodput
    gate)."""
    best_k, best_gain = 0, 0.0
    best = tokens / cost(rows)
    gain, survive = 0.0, 1.0
    for k, r in enumerate(_per_position(rate, max_k)[:max_k], start=1):
        survive *= r
        gain += survive
        value = (tokens + gain) / cost(rows + k)
        if value > best:
            best_k, best_gain, best = k, gain, value
    return best_k, best_gain


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """The engine-side speculative settings (config: runtime.speculative_decoding)."""

    # 32: Gemma 3 copy-heavy work at c = 1 went from 1.30-1.51× to 1.49-1.85× speculation
    # off with 24-48 instead of 12, side by side in two runs (a third run gave 1.26-1.36×
    # with 32: acceptance varies between runs, BENCHMARKS.md); the goodput gate still
    # picks each draft's length, so free chat drafts no more.
    max_draft_tokens: int = 32
    max_prefill: int = 0  # prompts longer than this never speculate; 0 = no limit
    min_acceptance: float = 0.5
    max_batch: int = 4  # no speculation when this many sequences decode together
    probe_after: int = 64
    cost: StepCost | None = None  # None: measured at worker start (engine/spec_cost.py)
    cost_record: str | None = None  # the file of measured step times (spec_cost.py)
    draft_model: str | None = None  # a GGUF: draft-model mode (engine/spec_draft.py)

    @property
    def step_cost(self) -> StepCost:
        """The gate's row costs: measured or configured, else the 2-core CPU line."""
        return self.cost if self.cost is not None else StepCost()


@dataclass(slots=True)
class _RequestDrafts:
    index: NgramIndex
    tracker: AcceptanceTracker
    enabled: bool
    match_length: int = 0  # of the draft proposed last (MatchPrior learns from it)
    first_hits: int = 0  # this request's short-match drafts whose first token held
    first_tries: int = 0  # this request's short-match drafts verified

    def first_rate(self, learned: float) -> float:
        """The chance that this request's next short-match draft gets its first token
        accepted: the worker's learned rate, worth `_OWN_WEIGHT` drafts, moved down by
        the request's own misses (never up). Why: the worker's rates mix its traffic;
        after copy-heavy requests they drafted on free chat too (SmolLM2 chat after edit
        and quote: 191 drafted tokens, 42 accepted, 0.95× speculation off). Moving it up
        as well drafted more on copy-heavy requests and lost (Gemma 3 quote 1.77× against
        1.94×). Long matches keep the worker's rate: it holds for them across traffic."""
        own = (_OWN_WEIGHT * learned + self.first_hits) / (_OWN_WEIGHT + self.first_tries)
        return min(learned, own)


_OWN_WEIGHT = 4.0  # the worker's learned first-token rate, in a request's own drafts
SHORT_MATCH = 8  # a match shorter than this may be chance: the request's record counts


def _sync(index: NgramIndex, request: Request) -> None:
    """Add the request's output tokens the index has not seen yet."""
    index.extend(request.output_token_ids[len(index.tokens) - request.num_prompt_tokens :])


# (expected acceptance, request id, the longest draft, its match length)
_Candidate = tuple[float, RequestId, list[int], int]


@dataclass(slots=True)
class SpecCounters:
    """Totals since the worker started (EngineStats.speculative)."""

    chunks: int = 0  # verification chunks (a decoding row plus a draft)
    chunks_accepted: int = 0  # of those, the ones whose whole draft was accepted
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafted tokens accepted ("tokens reused")


@dataclass(slots=True)
class NgramProposer:
    """The scheduler's `DraftProposer` for prompt-lookup drafts, with the adaptive gates:
    none when `max_batch` or more sequences decode this step; none for a request paused
    by its acceptance tracker, its own opt-out, or a prompt over `max_prefill`; and each
    draft only as long as it raises the step's expected tokens per unit of cost
    (`best_draft_length`, most promising requests first). Mutates per-request state;
    `forget` a request when it finishes."""

    config: SpecConfig
    counters: SpecCounters = field(default_factory=SpecCounters)
    prior: MatchPrior = field(default_factory=MatchPrior)
    _requests: dict[RequestId, _RequestDrafts] = field(default_factory=dict)

    def register(self, request: Request, *, enabled: bool) -> None:
        """Start tracking `request` (its opt-out in `enabled`)."""
        limit = self.config.max_prefill
        index = NgramIndex()
        on = enabled and (limit <= 0 or request.num_prompt_tokens <= limit)
        if on:
            index.extend(request.prompt_token_ids)
        tracker = AcceptanceTracker(self.config.min_acceptance, self.config.probe_after)
        self._requests[request.request_id] = _RequestDrafts(index, tracker, on)

    def forget(self, request_id: RequestId) -> None:
        self._requests.pop(request_id, None)

    def close(self) -> None:
        """Free what the proposer holds (nothing here; a draft model's context)."""

    def _active(self, requests: list[Request]) -> list[tuple[Request, _RequestDrafts]]:
        """The requests that may speculate now: not opted out, and not paused, or paused
        but copying again. A lookup match of `SHORT_MATCH` tokens or more ends a pause at
        once (a probe, as after `probe_after`): the output has been copying for that
        long, and waiting out the pause lost such stretches (Gemma 3 edit, replayed by
        bench/spec_policy.py: a request paused for 63 tokens while it copied 35 of them;
        decode 1.52× -> 1.56× speculation off, SmolLM2 edit 1.17× -> 1.20×, chat and
        quote unchanged on both models)."""
        active = []
        for request in requests:
            state = self._requests.get(request.request_id)
            if state is None or not state.enabled:
                continue
            num_output = len(request.output_token_ids)
            tracker = state.tracker
            if not tracker.active(num_output):
                _sync(state.index, request)
                if state.index.propose_matched(1)[1] < SHORT_MATCH:
                    continue
                tracker.probe(num_output)
            active.append((request, state))
        return active

    def _candidates(self, requests: list[Request]) -> list[_Candidate]:
        """(expected acceptance, id, longest draft, match length) of every request that
        may speculate, most promising first."""
        found = self._drafts(self._active(requests))
        found.sort(key=lambda c: -c[0])
        return found

    def _drafts(self, active: list[tuple[Request, _RequestDrafts]]) -> list[_Candidate]:
        found: list[_Candidate] = []
        for request, state in active:
            _sync(state.index, request)
            draft, length = state.index.propose_matched(self.config.max_draft_tokens)
            if draft:
                # NOTE: the gate's rate is the one learned for this match length; the
                # request's own tracker only pauses it (below min_acceptance). Its fast
                # average fell under break-even after the one miss that ends every copied
                # stretch, and the gate then declined the next stretch's first drafts.
                state.match_length = length
                found.append((self.prior.rate(length), request.request_id, draft, length))
        return found

    def propose(
        self, requests: list[Request], budget: int, max_cost: float = 0.0
    ) -> dict[RequestId, list[int]]:
        """Drafts for some of `requests` (the ones decoding this step), at most `budget`
        tokens in all; with `max_cost` > 0, only as many rows as keep the step's cost
        within `max_cost` times that of its decode rows alone (the stall-free ITL
        target). The caller caps each to its KV."""
        if len(requests) >= self.config.max_batch or budget <= 0:
            return {}
        cost = self.config.step_cost
        rows, tokens = len(requests), float(len(requests))
        ceiling = max_cost * cost(rows) if max_cost > 0 else float("inf")
        drafts: dict[RequestId, list[int]] = {}
        for rate, request_id, draft, length in self._candidates(requests):
            room = min(len(draft), budget)
            while room > 0 and cost(rows + room) > ceiling:
                room -= 1
            if room == 0:
                continue
            # an n-gram draft: each position at the rate of its own match length, the
            # first one also at this request's own record
            rates: float | list[float] = rate
            if length > 0:
                rates = self.prior.along(length, room)
                if length < SHORT_MATCH:
                    rates[0] = self._requests[request_id].first_rate(rates[0])
            k, gain = best_draft_length(rates, room, rows, tokens, cost)
            if k == 0 and length > 0 and self.prior.explore(length):
                k = min(room, self.prior.explore_tokens)
                gain = expected_gain(rates, k)
            if k == 0:
                continue
            drafts[request_id] = draft[:k]
            rows, tokens, budget = rows + k, tokens + gain, budget - k
        return drafts

    def record(self, request: Request, drafted: int, accepted: int) -> None:
        """The outcome of verifying one draft of `request`."""
        c = self.counters
        c.chunks += 1
        c.chunks_accepted += accepted == drafted
        c.drafted_tokens += drafted
        c.accepted_tokens += accepted
        request.num_draft_tokens += drafted
        request.num_draft_accepted += accepted
        state = self._requests.get(request.request_id)
        if state is not None:
            state.tracker.record(drafted, accepted, len(request.output_token_ids))
            if 0 < state.match_length < SHORT_MATCH:
                state.first_tries += 1
                state.first_hits += accepted > 0
            if state.match_length > 0:  # an n-gram draft (not a draft model's)
                self.prior.record(state.match_length, drafted, accepted)
