"""How long an engine step takes, learned online: the base of the latency-aware step budget.

Owns: a linear model of a step's wall time, `intercept + per_seq × decoding sequences +
per_token × other tokens + prompt_overhead (when it carries other tokens)`, fitted by
recursive least squares with forgetting over every step the engine reports, and the
prompt-token budget that keeps a step under a target time. Pure logic: no clock, no
llama.cpp; EngineCore feeds it measured steps.

Why a fit and not a table: a step's time is dominated by two costs that differ by model,
machine, thread count and context length: one row per decoding sequence (its sampling
and its attention over a growing KV) and the prompt tokens carried with them. Both are
learned from the steps the engine runs anyway, so nothing is measured at start-up and a
busy host (slower steps) lowers the budget on its own. The forgetting factor keeps the
fit following a drifting machine (half-weight after about 70 steps).

Why the fourth term: a step that carries a prompt chunk costs a fixed amount more than
its rows predict (the chunk's first sample, a second kernel shape); without it the fit
was pulled toward the decode-only steps, which outnumber the others, and under-predicted
mixed steps by a median 14% and a p90 39% (SmolLM2, 8 streams, 2 cores), which is where a
stall-free target's ITL p99 came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_FORGET = 0.99
# Prior: 5 ms per step, 2 ms per decoding sequence, 1 ms per prompt token (a 2-core CPU
# running a 135M model is of that order), with a variance wide enough that a few
# measured steps replace it.
_PRIOR = (0.005, 0.002, 0.001, 0.0)
_PRIOR_VARIANCE = (1e-2, 1e-4, 1e-5, 1e-2)
_N = len(_PRIOR)
# A per-token cost below this is treated as this (a noisy fit must not allow huge chunks).
_MIN_TOKEN_COST_S = 1e-5


def _zeros() -> list[list[float]]:
    return [[0.0] * _N for _ in range(_N)]


@dataclass(slots=True)
class StepCostModel:
    """Online estimate of a step's seconds from its decoding sequences and other tokens."""

    theta: list[float] = field(default_factory=lambda: list(_PRIOR))
    covariance: list[list[float]] = field(default_factory=_zeros)
    observations: int = 0

    def __post_init__(self) -> None:
        if not any(any(row) for row in self.covariance):
            for i, variance in enumerate(_PRIOR_VARIANCE):
                self.covariance[i][i] = variance

    def predict_s(self, decoding: int, tokens: int) -> float:
        """Expected seconds of a step with `decoding` sequences and `tokens` other tokens."""
        a, b, c, d = self.theta
        return a + b * decoding + c * tokens + (d if tokens else 0.0)

    @property
    def token_cost_s(self) -> float:
        return max(self.theta[2], _MIN_TOKEN_COST_S)

    def observe(self, decoding: int, tokens: int, seconds: float) -> None:
        """Fold in one measured step (recursive least squares with forgetting)."""
        x = (1.0, float(decoding), float(tokens), 1.0 if tokens else 0.0)
        p = self.covariance
        px = [sum(p[i][j] * x[j] for j in range(_N)) for i in range(_N)]
        denominator = _FORGET + sum(x[i] * px[i] for i in range(_N))
        gain = [v / denominator for v in px]
        error = seconds - self.predict_s(decoding, tokens)
        self.theta = [t + g * error for t, g in zip(self.theta, gain, strict=True)]
        self.covariance = [
            [(p[i][j] - gain[i] * px[j]) / _FORGET for j in range(_N)] for i in range(_N)
        ]
        self.observations += 1

    def prompt_budget(self, decoding: int, target_s: float) -> int:
        """Prompt tokens a step with `decoding` sequences may carry and still take at most
        `target_s` (0 when the decode rows alone use the target up)."""
        spare_s = target_s - self.predict_s(decoding, 0) - max(0.0, self.theta[3])
        return max(0, int(spare_s / self.token_cost_s))

    def split_pays(self, following_tokens: int, later_prompts: int) -> bool:
        """Whether to end a step where a prompt ends rather than carry `following_tokens`
        more prompt tokens: its first token comes that many tokens' time earlier, and
        each of the `later_prompts` after it pays one more step's fixed cost."""
        fixed_s = max(0.0, self.theta[0]) + max(0.0, self.theta[3])
        return following_tokens * self.token_cost_s > fixed_s * max(1, later_prompts)
