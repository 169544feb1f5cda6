"""The standard GRPO trajectory workload every benchmark here runs: seeded, deterministic, numpy-backed.

G groups of K samples. Per group one prompt of P ~ U[128, 1024] tokens shared by its samples; per
sample a response of R tokens, R lognormal (median 1024, sigma 1.0) clipped to [64, 8192], with float32
logprobs, a uint8 loss mask, a 0/1 reward and the group-normalised advantage; optionally, per response
token, 1..8 top-p candidates (doubly ragged).

Each group's arrays are contiguous, so :meth:`SyntheticGroup.encode` builds its record batch without
copying payload. "Payload bytes" counts values only (no offsets, no padding), as the benchmark defines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from trajflight.codec import DoublyRagged, encode_group

__all__ = ["SyntheticGroup", "make_workload"]


@dataclass(frozen=True, slots=True)
class SyntheticGroup:
    """One synthetic GRPO group as contiguous numpy arrays (values + int32 offsets per ragged column)."""

    group_id: int
    prompt: np.ndarray
    response_values: np.ndarray
    response_offsets: np.ndarray
    logprobs: np.ndarray
    loss_mask: np.ndarray
    reward: np.ndarray
    advantage: np.ndarray
    top_p_ids: np.ndarray | None = None
    top_p_probs: np.ndarray | None = None
    top_p_offsets: np.ndarray | None = None

    @property
    def num_samples(self) -> int:
        """K, the samples in the group."""
        return len(self.response_offsets) - 1

    @property
    def payload_bytes(self) -> int:
        """Bytes of values as stored (the prompt counted once per sample, as the row layout stores it)."""
        per_token = self.response_values.nbytes + self.logprobs.nbytes + self.loss_mask.nbytes
        top_p = (
            0
            if self.top_p_ids is None or self.top_p_probs is None
            else self.top_p_ids.nbytes + self.top_p_probs.nbytes
        )
        return int(
            self.prompt.nbytes * self.num_samples
            + per_token
            + top_p
            + self.reward.nbytes
            + self.advantage.nbytes
        )

    def columns(self, **more: Any) -> dict[str, Any]:
        """The group's columns as keyword arguments of :func:`~trajflight.codec.encode_group` (and of
        ``Writer.put``): ``(values, offsets)`` pairs that the encoder aliases. ``more`` adds or overrides
        arguments (``sample_ids=...``, ``policy_version=...``)."""
        offsets = self.response_offsets
        out: dict[str, Any] = {
            "prompt_ids": self.prompt,
            "response_ids": (self.response_values, offsets),
            "response_logprobs": (self.logprobs, offsets),
            "loss_mask": (self.loss_mask, offsets),
            "reward": self.reward,
            "advantage": self.advantage,
        }
        if self.top_p_ids is not None and self.top_p_probs is not None and self.top_p_offsets is not None:
            out["top_p_ids"] = DoublyRagged(self.top_p_ids, offsets, self.top_p_offsets)
            out["top_p_probs"] = DoublyRagged(self.top_p_probs, offsets, self.top_p_offsets)
        return {**out, **more}

    def encode(self, job_id: str, epoch: int, *, policy_version: int = 0) -> pa.RecordBatch:
        """Encode the group with :func:`trajflight.codec.encode_group` (aliasing these arrays)."""
        return encode_group(
            job_id=job_id, epoch=epoch, group_id=self.group_id, **self.columns(policy_version=policy_version)
        )


def make_workload(
    groups: int = 64,
    samples: int = 8,
    *,
    seed: int = 0,
    top_p: bool = False,
    response_median: float = 1024.0,
    first_group_id: int = 0,
) -> list[SyntheticGroup]:
    """Generate the standard workload: ``groups`` x ``samples`` (defaults G=64, K=8, about 10 MB).

    Args:
        groups: G.
        samples: K, samples per group.
        seed: Seed of the generator; the same seed gives the same bytes.
        top_p: Also generate doubly ragged top-p candidates (about 2.5x the payload).
        response_median: Median response length (lognormal, sigma 1.0, clipped to 64..8192); lower it
            for quick runs.
        first_group_id: Group ids are ``first_group_id .. first_group_id + groups - 1``.
    """
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        prompt = rng.integers(0, 151_936, int(rng.integers(128, 1025)), dtype=np.int32)
        lengths = np.clip(rng.lognormal(np.log(response_median), 1.0, samples), 64, 8192).astype(np.int64)
        offsets = np.zeros(samples + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = int(offsets[-1])
        reward = (rng.random(samples) < 0.5).astype(np.float32)
        advantage = ((reward - reward.mean()) / (reward.std() + 1e-6)).astype(np.float32)
        extra = {}
        if top_p:
            counts = rng.integers(1, 9, tokens)
            inner = np.zeros(tokens + 1, dtype=np.int32)
            np.cumsum(counts, out=inner[1:])
            candidates = int(inner[-1])
            probs = rng.random(candidates, dtype=np.float32)
            extra = {
                "top_p_ids": rng.integers(0, 151_936, candidates, dtype=np.int32),
                "top_p_probs": probs,
                "top_p_offsets": inner,
            }
        out.append(
            SyntheticGroup(
                group_id=first_group_id + g,
                prompt=prompt,
                response_values=rng.integers(0, 151_936, tokens, dtype=np.int32),
                response_offsets=offsets,
                logprobs=-rng.exponential(1.0, tokens).astype(np.float32),
                loss_mask=np.ones(tokens, dtype=np.uint8),
                reward=reward,
                advantage=advantage,
                **extra,
            )
        )
    return out
