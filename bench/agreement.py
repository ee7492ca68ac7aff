"""Agreement of two engines' answers on the same records: per-question top-1 and KL divergence."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clef_head.layout import RecordLayout


def question_agreement(
    layouts: Sequence[RecordLayout],
    reference: Sequence[torch.Tensor],
    candidate: Sequence[torch.Tensor],
) -> dict[str, float | int]:
    """Compare flat option logits record by record, question by question.

    Returns the number of questions, the share whose top-1 option is the same, the mean and max
    KL(reference ‖ candidate) over each question's option distribution (nats), the largest
    absolute probability difference of any option, and two scales that say whether top-1 flips
    come from near-ties: the median gap between the reference's two best logits of a question
    and the median absolute logit difference between the two engines.
    """
    if not (len(layouts) == len(reference) == len(candidate)):
        raise ValueError(f"lengths differ: {len(layouts)} layouts, {len(reference)} vs {len(candidate)} logits")
    same = total = 0
    kls: list[torch.Tensor] = []
    max_diff = 0.0
    margins: list[torch.Tensor] = []
    differences: list[torch.Tensor] = []
    for index, (layout, ref, cand) in enumerate(zip(layouts, reference, candidate, strict=True)):
        if ref.shape != (layout.option_count,) or cand.shape != (layout.option_count,):
            raise ValueError(
                f"record {index}: expected {layout.option_count} logits, got {tuple(ref.shape)} and {tuple(cand.shape)}"
            )
        sizes = [len(question.option_ids) for question in layout.questions]
        for ref_q, cand_q in zip(torch.split(ref.float(), sizes), torch.split(cand.float(), sizes), strict=True):
            log_p, log_q = ref_q.log_softmax(-1), cand_q.log_softmax(-1)
            kls.append((log_p.exp() * (log_p - log_q)).sum())
            max_diff = max(max_diff, float((log_p.exp() - log_q.exp()).abs().max()))
            same += int(ref_q.argmax() == cand_q.argmax())
            total += 1
            if len(ref_q) > 1:
                best_two = ref_q.topk(2).values
                margins.append(best_two[0] - best_two[1])
            differences.append((ref_q - cand_q).abs())
    if total == 0:
        raise ValueError("no questions to compare")
    kl = torch.stack(kls)
    return {
        "questions": total,
        "top1_agreement": same / total,
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
        "max_probability_diff": max_diff,
        "median_reference_top2_margin": float(torch.stack(margins).median()) if margins else float("nan"),
        "median_abs_logit_diff": float(torch.cat(differences).median()),
        "max_abs_logit_diff": float(torch.cat(differences).max()),
    }
