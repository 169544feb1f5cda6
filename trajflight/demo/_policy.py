"""The demo's policy in torch, as the trainer holds it: the network, its logprobs of a leased batch, the
clipped GRPO objective, a small Adam, and the publication of its weights.

The network is a tiny causal language model: the next token's logits from the
:data:`~trajflight.demo._task.CONTEXT` tokens before it (embeddings, one hidden tanh layer), about two
thousand parameters. The rollout workers run the same network in numpy
(:class:`trajflight.demo._task.Engine`) from the ``.npz`` files :func:`publish_weights` writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajflight.demo._task import CONTEXT, VOCAB

__all__ = ["Adam", "Policy", "grpo_loss", "make_policy", "publish_weights", "token_logprobs"]

EMBED = 16
HIDDEN = 64


class Policy(torch.nn.Module):
    """A tiny causal language model over the task's vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, EMBED)
        self.hidden = torch.nn.Linear(CONTEXT * EMBED, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., VOCAB]`` of the token following each window ``context[..., CONTEXT]``."""
        logits: torch.Tensor = self.out(torch.tanh(self.hidden(self.embed(context).flatten(-2))))
        return logits


def make_policy(seed: int) -> Policy:
    """A freshly initialised policy; the same seed gives the same weights (the global RNG is untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Policy()


def publish_weights(policy: Policy, path: Path) -> None:
    """Write the policy's weights to ``path`` (``.npz``) atomically: temporary file, then rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **{k: v.detach().numpy() for k, v in policy.state_dict().items()})
    os.replace(tmp, path)


def token_logprobs(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_offsets: torch.Tensor,
    response_ids: torch.Tensor,
    response_offsets: torch.Tensor,
) -> torch.Tensor:
    """The policy's logprob of every response token of a batch, flat, aligned with ``response_ids``.

    Takes the ragged columns as a lease delivers them (values plus offsets per sample, offsets starting
    at 0). Each token's window is the :data:`CONTEXT` tokens before it in prompt + response, gathered in
    one indexing operation: no loop over samples.
    """
    p_len = (prompt_offsets[1:] - prompt_offsets[:-1]).long()
    r_len = (response_offsets[1:] - response_offsets[:-1]).long()
    starts = torch.zeros(len(p_len) + 1, dtype=torch.long)
    torch.cumsum(p_len + r_len, 0, out=starts[1:])
    joined = torch.empty(int(starts[-1]), dtype=torch.long)
    at_prompt = torch.repeat_interleave(starts[:-1] - prompt_offsets[:-1].long(), p_len)
    joined[at_prompt + torch.arange(len(prompt_ids))] = prompt_ids.long()
    at = torch.repeat_interleave(starts[:-1] + p_len - response_offsets[:-1].long(), r_len)
    at = at + torch.arange(len(response_ids))
    joined[at] = response_ids.long()
    windows = joined[at[:, None] + torch.arange(-CONTEXT, 0)]
    logp = torch.log_softmax(policy(windows), dim=-1)
    return logp.gather(1, response_ids.long()[:, None]).squeeze(1)


def grpo_loss(policy: Policy, batch: Any, *, clip: float) -> torch.Tensor:
    """The clipped GRPO objective of a batch decoded with ``layout="ragged"``, as a loss to minimise.

    Per response token: ``ratio = exp(logp_policy - logp_behaviour)`` against the logprob the rollout
    worker stored, the sample's advantage ``A``, and ``min(ratio * A, clip(ratio, 1 - clip, 1 + clip) *
    A)``, averaged over the tokens ``loss_mask`` selects; negated.
    """
    ragged = batch.ragged
    prompts, responses = ragged["prompt_ids"], ragged["response_ids"]
    new = token_logprobs(policy, prompts.values, prompts.offsets, responses.values, responses.offsets)
    old = ragged["response_logprobs"].values
    mask = ragged["loss_mask"].values.float()
    lengths = (responses.offsets[1:] - responses.offsets[:-1]).long()
    advantage = torch.repeat_interleave(batch.tensors["advantage"], lengths)
    ratio = torch.exp(new - old)
    surrogate = torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip, 1 + clip) * advantage)
    loss: torch.Tensor = -(surrogate * mask).sum() / mask.sum().clamp(min=1.0)
    return loss


class Adam:
    """Adam (Kingma and Ba, 2015) with ``torch.optim.Adam``'s defaults, for the demo's few parameters.

    Not ``torch.optim.Adam``: the first use of a ``torch.optim`` optimizer imports ``torch._dynamo``,
    which takes longer than training this policy does.
    """

    def __init__(
        self, params: list[torch.Tensor], *, lr: float, betas: tuple[float, float] = (0.9, 0.999)
    ) -> None:
        self.params = params
        self.lr = lr
        self.betas = betas
        self.eps = 1e-8
        self.t = 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def zero_grad(self) -> None:
        """Forget the gradients of the last step."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update from the parameters' gradients."""
        self.t += 1
        b1, b2 = self.betas
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v / (1 - b2**self.t)).sqrt_().add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / (1 - b1**self.t))

    def state_dict(self) -> dict[str, Any]:
        """Its state, for a checkpoint."""
        return {"t": self.t, "m": [m.clone() for m in self.m], "v": [v.clone() for v in self.v]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back to a checkpoint's state."""
        self.t = int(state["t"])
        for mine, saved in zip(self.m + self.v, state["m"] + state["v"], strict=True):
            mine.copy_(saved)
