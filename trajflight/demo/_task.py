"""The demo's task, its verifiable reward, and the rollout engine that samples from the policy.

**Count to nine.** A prompt is 2 to 4 consecutive digits (``3 4 5``); the right response goes on
counting up to 9 and then stops (``6 7 8 9 <eos>``). The reward is partial credit: the fraction of
response tokens that follow the rule from the token before them (the successor of digit ``d < 9`` is
``d + 1``, the successor of ``9`` is end-of-sequence). A response is cut after :data:`MAX_RESPONSE`
tokens. A random policy scores about 0.1; the right one scores 1.0.

The policy (:mod:`trajflight.demo._policy`) is a tiny causal language model the trainer holds in torch.
Rollout workers run the same network in numpy from the weights the trainer publishes (an inference
engine apart from the trainer, as vLLM is; it also spares every worker importing torch). Sampling is
from the full distribution (temperature 1), so the logprobs a worker stores are the policy's; the top-p
candidates it stores beside them are the nucleus (:data:`TOP_P`) of each step's distribution.

No I/O here but :func:`load_weights` (the ``.npz`` file of one policy version).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "CONTEXT",
    "EOS",
    "MAX_RESPONSE",
    "TOP_P",
    "VOCAB",
    "Engine",
    "Rollout",
    "load_weights",
    "make_prompt",
    "sample_group",
    "score",
    "weights_path",
]

VOCAB = 11
"""Digits 0-9 and :data:`EOS`."""
EOS = 10
MAX_RESPONSE = 10
"""Response tokens sampled at most (the longest right answer has 8)."""
CONTEXT = 2
"""Tokens the policy sees before each prediction (every prompt has at least this many)."""
TOP_P = 0.9


def make_prompt(seed: int, prompt: int) -> np.ndarray:
    """Prompt number ``prompt`` of the run seeded ``seed``: 2-4 consecutive digits ending at most at 8
    (so the right response has at least one digit). The same arguments give the same prompt."""
    rng = np.random.default_rng([seed, prompt])
    length = int(rng.integers(2, 5))
    start = int(rng.integers(0, 10 - length))
    return np.arange(start, start + length, dtype=np.int32)


def score(prompt: np.ndarray, response: np.ndarray) -> float:
    """The verifiable reward of one response: the fraction of its tokens that are the successor of the
    token before them (the prompt's last digit before the first). 0.0 for an empty response."""
    if len(response) == 0:
        return 0.0
    previous = np.concatenate([prompt[-1:], response[:-1]])
    return float(np.mean(response == np.where(previous >= 9, EOS, previous + 1)))


class Engine:
    """The policy's network in numpy, for sampling: the weights of one published version.

    Args:
        weights: The policy's ``state_dict`` as numpy arrays (what :func:`load_weights` returns).
    """

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.embed = weights["embed.weight"]
        self.w1, self.b1 = weights["hidden.weight"], weights["hidden.bias"]
        self.w2, self.b2 = weights["out.weight"], weights["out.bias"]

    def probs(self, context: np.ndarray) -> np.ndarray:
        """Next-token probabilities ``[n, VOCAB]`` (float64) for windows ``context[n, CONTEXT]``."""
        x = self.embed[context].reshape(len(context), -1)
        logits = (np.tanh(x @ self.w1.T + self.b1) @ self.w2.T + self.b2).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        p: np.ndarray = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return p


@dataclass(frozen=True, slots=True)
class Rollout:
    """One sampled group as the codec takes it: flat values plus offsets per sample.

    Attributes:
        response_ids: Sampled tokens of every sample, one after another (int32).
        response_logprobs: The policy's logprob of each sampled token (float32).
        offsets: Sample ``i`` is ``[offsets[i], offsets[i + 1])`` of the two arrays above (int32).
        top_p_ids: Per token, the nucleus candidates, most likely first (flat int32).
        top_p_probs: Their probabilities (float32), aligned with ``top_p_ids``.
        top_p_offsets: Token ``j``'s candidates are ``[top_p_offsets[j], top_p_offsets[j + 1])``.
        rewards: The verifiable reward of each sample.
        finish_reasons: ``"stop"`` (ended with EOS) or ``"length"`` (cut at :data:`MAX_RESPONSE`).
    """

    response_ids: np.ndarray
    response_logprobs: np.ndarray
    offsets: np.ndarray
    top_p_ids: np.ndarray
    top_p_probs: np.ndarray
    top_p_offsets: np.ndarray
    rewards: list[float]
    finish_reasons: list[str]


def sample_group(engine: Engine, prompt: np.ndarray, samples: int, rng: np.random.Generator) -> Rollout:
    """Sample ``samples`` responses to ``prompt`` (all at once), score them, and keep each token's
    logprob and top-p candidates. The same engine, prompt and generator state give the same group."""
    seq = np.tile(prompt.astype(np.int64), (samples, 1))
    steps: list[np.ndarray] = []
    for _ in range(MAX_RESPONSE):
        p = engine.probs(seq[:, -CONTEXT:])
        token = (rng.random((samples, 1)) > np.cumsum(p, axis=1)).sum(axis=1).clip(max=VOCAB - 1)
        steps.append(p)
        seq = np.concatenate([seq, token[:, None]], axis=1)
        if (seq[:, len(prompt) :] == EOS).any(axis=1).all():
            break
    ids = seq[:, len(prompt) :].astype(np.int32)  # [samples, steps]
    dist = np.stack(steps, axis=1)  # [samples, steps, VOCAB]
    ended = ids == EOS
    lengths = np.where(ended.any(axis=1), ended.argmax(axis=1) + 1, ids.shape[1])
    offsets = np.zeros(samples + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    real = np.arange(ids.shape[1])[None, :] < lengths[:, None]  # tokens up to and with EOS
    logprobs = np.log(np.take_along_axis(dist, ids[..., None], axis=-1)[..., 0])
    # The nucleus of each step: the most likely tokens until their probabilities reach TOP_P.
    order = np.argsort(-dist, axis=-1, kind="stable")[real]  # [tokens, VOCAB]
    ranked = np.take_along_axis(dist[real], order, axis=-1)
    keep = np.cumsum(ranked, axis=-1) - ranked < TOP_P
    top_offsets = np.zeros(len(order) + 1, dtype=np.int32)
    np.cumsum(keep.sum(axis=1), out=top_offsets[1:])
    return Rollout(
        response_ids=ids[real],
        response_logprobs=logprobs[real].astype(np.float32),
        offsets=offsets,
        top_p_ids=order[keep].astype(np.int32),
        top_p_probs=ranked[keep].astype(np.float32),
        top_p_offsets=top_offsets,
        rewards=[score(prompt, ids[i, :n]) for i, n in enumerate(lengths)],
        finish_reasons=["stop" if ended[i, n - 1] else "length" for i, n in enumerate(lengths)],
    )


def weights_path(directory: str | os.PathLike[str], epoch: int, version: int) -> Path:
    """Where the weights of policy ``version`` of ``epoch`` are published (one file per version)."""
    return Path(directory) / f"policy-e{epoch}-v{version:06d}.npz"


def load_weights(path: Path) -> dict[str, np.ndarray] | None:
    """The weights published at ``path``; None when there is no such file (yet)."""
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        return None
