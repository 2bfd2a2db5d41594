"""A step's drafts fitted to a GPU step's roofline, on the device.

``stepcost.Roofline.admit`` in torch ops: the number of drafted tokens the
step should verify is the one that maximises expected emitted tokens per
second; the batch keeps its likeliest tokens (each token's running product
of probabilities), so each row keeps a prefix of its draft.  No read back to
the host: the budget stays a device tensor.
"""

from __future__ import annotations

import torch

from suffixspec.device.draft_ref import StepOutputs


def fit_batch(out: StepOutputs, roofline) -> None:
    """Cut ``out``'s rows (in place) to what ``roofline`` (``flat``,
    ``per_token``, ``host`` seconds) admits for the whole batch."""
    b, k = out.probs.shape
    slot = torch.arange(k, device=out.probs.device)
    drafted = slot[None, :] < out.num_valid[:, None]
    flat = torch.where(drafted, out.probs.to(torch.float64), -1.0).flatten()
    order = torch.argsort(flat, descending=True, stable=True)
    ranked = flat[order]
    gains = torch.cat([ranked.new_zeros(1), torch.where(ranked >= 0, ranked, 0.0).cumsum(0)])
    tokens = b + torch.arange(b * k + 1, device=flat.device, dtype=torch.float64)
    seconds = torch.clamp(roofline.per_token * tokens, min=roofline.flat) + roofline.host
    rate = (b + gains) / seconds
    count = drafted.sum()
    rate = torch.where(torch.arange(b * k + 1, device=flat.device) <= count, rate, -1.0)
    budget = rate.argmax()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(b * k, device=flat.device)
    keep = (rank < budget).view(b, k) & drafted
    keep = keep.to(torch.int32).cumprod(dim=1).bool()
    out.num_valid.copy_(keep.sum(dim=1).to(out.num_valid.dtype))
    out.drafts.copy_(torch.where(keep, out.drafts, out.last[:, None]))
    out.conf.mul_(keep)
    out.probs.mul_(keep)
    out.buckets.mul_(keep)
