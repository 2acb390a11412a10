"""GPU check of analytic/verl.py ``log_prob_forward_bytes``'s head share: verl's no-grad log-prob tail on the logits
(``DataParallelPPOActor._forward_micro_batch``, padded path, v0.5.0) measured with torch.cuda.max_memory_allocated.

The hidden states (b, S, H) bf16 and the head (V, H) bf16 are allocated first; the measured increase covers the
head's matmul output (the logits, L = b S V x 2), ``div_`` in place, the response slice, ``logprobs_from_logits_v2``
(per row log_softmax, bf16) and ``entropy_from_logits`` (softmax, logsumexp, product): counted L + 2 b R V x 2
with entropy, L + R V x 2 for the v2 log-probs alone (Qwen2.5-0.5B's V = 151,936, H = 896; b = 2, P = R = 512:
1,244,659,712 and 777,912,320 B; measured output in verl_log_prob_head.txt).  Prints one JSON line per case to stdout and to $OUT/verl_log_prob_head.json.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F


def logprobs_v2(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # verl/utils/torch_functional.py logprobs_from_logits_v2, bf16 branch
    out = []
    for row_logits, row_labels in zip(logits, labels):
        row = F.log_softmax(row_logits, dim=-1)
        out.append(row.gather(dim=-1, index=row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(out)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    # verl/utils/torch_functional.py entropy_from_logits
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def case(b: int, prompt: int, resp: int, vocab: int, hidden: int, entropy: bool) -> dict[str, object]:
    dev = torch.device("cuda")
    h = torch.randn(b, prompt + resp, hidden, device=dev, dtype=torch.bfloat16)
    w = torch.randn(vocab, hidden, device=dev, dtype=torch.bfloat16) * 0.02
    labels = torch.randint(0, vocab, (b, resp), device=dev)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        logits = h @ w.T
        logits.div_(1.0)
        sl = logits[:, -resp - 1:-1, :]
        lp = logprobs_v2(sl, labels)
        ent = entropy_from_logits(sl) if entropy else None
        del lp, ent, sl, logits
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - base
    rows = b * resp * vocab * 2
    predicted = b * (prompt + resp) * vocab * 2 + (2 * rows if entropy else resp * vocab * 2)
    return {"b": b, "prompt": prompt, "resp": resp, "entropy": entropy, "measured_bytes": measured,
            "predicted_bytes": predicted, "ratio": measured / predicted, "torch": torch.__version__,
            "device": torch.cuda.get_device_name()}


if __name__ == "__main__":
    out = [case(2, 512, 512, 151_936, 896, e) for e in (True, False)] + [case(4, 256, 768, 151_936, 896, True)]
    for row in out:
        print(json.dumps(row))
    target = os.environ.get("OUT")
    if target:
        with open(os.path.join(target, "verl_log_prob_head.json"), "w") as f:
            json.dump(out, f, indent=1)
