"""Runs TRL 1.12.0's own ``PPOTrainer`` on the CPU with tiny random Qwen2 models and checks which rollout tensors are
alive at each phase, as analytic/ppo.py models them (docs/rl.md, "PPO").

TRL 1.12.0 is the last release with ``trl.experimental.ppo`` (removed in 1.13.0), and the project's environment has a
later TRL, so the check reads a TRL 1.12.0 tree given on the command line:

    pip download trl==1.12.0 --no-deps -d /tmp/trl112 && (cd /tmp/trl112 && unzip -q trl-1.12.0-*.whl)
    python benchmarks/ppo_trl_cpu_check.py /tmp/trl112

It patches ``batch_generation`` and ``forward`` in TRL's module to list, by the garbage collector, the live fp32
``(batch, response_length, vocab)`` tensors (the generate scores) and the compute-dtype ``(micro_batch,
response_length, vocab)`` ones (a micro-batch's logits slice and ``prob_dist``) and prints one line per check.
Output with TRL 1.12.0, transformers 5.24.0, torch 2.13.0 (CPU): every check ``ok``.
"""

from __future__ import annotations

import gc
import sys
from typing import Any


def _live(v: int, r: int) -> list[tuple[tuple[int, ...], int]]:
    import torch

    out = set()
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.dim() == 3 and o.shape[1] == r and o.shape[2] == v:
                out.add((tuple(o.shape), o.untyped_storage().data_ptr()))
        except Exception:  # noqa: BLE001, S112 - objects the collector lists may be half-built
            continue
    return sorted(out)


def main(trl_path: str) -> int:
    sys.path.insert(0, trl_path)
    import torch
    import trl
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        PreTrainedTokenizerFast,
        Qwen2Config,
    )
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as pt

    v, h, p, r, b, ga = 512, 64, 12, 7, 2, 2
    cfg = Qwen2Config(vocab_size=v, hidden_size=h, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    policy, ref = AutoModelForCausalLM.from_config(cfg), AutoModelForCausalLM.from_config(cfg)
    cfg1 = Qwen2Config(**{**cfg.to_dict(), "num_labels": 1, "id2label": {0: "score"}, "label2id": {"score": 0}})
    value, reward = AutoModelForSequenceClassification.from_config(cfg1), AutoModelForSequenceClassification.from_config(cfg1)
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, v)}}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                  pad_token="<pad>", eos_token="<eos>")
    ds = Dataset.from_dict({"input_ids": [[(i * 7 + j) % (v - 2) + 2 for j in range(p)] for i in range(16)]})
    args = PPOConfig(output_dir="/tmp/ppo_trl_cpu_check", per_device_train_batch_size=b, gradient_accumulation_steps=ga,
                     local_rollout_forward_batch_size=b, response_length=r, num_ppo_epochs=1, total_episodes=2 * b * ga,
                     num_sample_generations=0, report_to=[], bf16=False, use_cpu=True, save_strategy="no",
                     logging_steps=1000)
    seen: list[tuple[str, list[tuple[tuple[int, ...], int]]]] = []
    orig_bg, orig_fwd = pt.batch_generation, pt.forward

    def bg(*a: Any, **k: Any) -> Any:
        seen.append(("rollout", _live(v, r)))
        return orig_bg(*a, **k)

    def fwd(model: Any, qr: Any, pad: Any) -> Any:
        if hasattr(model, "value_model"):
            seen.append(("train", _live(v, r)))
        return orig_fwd(model, qr, pad)

    pt.batch_generation, pt.forward = bg, fwd
    n_pol = sum(x.numel() for x in policy.parameters())
    n_val = sum(x.numel() for x in value.parameters())
    PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward, value_model=value,
               train_dataset=ds, eval_dataset=ds).train()
    big = (b * ga, r, v)
    rollouts = [s for name, s in seen if name == "rollout"]
    trains = [s for name, s in seen if name == "train"]
    checks = {
        f"TRL {trl.__version__}: value model = policy + hidden (tied head, score {h} x 1): {n_val} == {n_pol} + {h}":
            n_val == n_pol + h,
        "first rollout: no scores alive before batch_generation": rollouts[0] == [],
        f"second rollout: the previous update's {big} scores alive before batch_generation":
            [s for s, _ in rollouts[1]] == [big],
        f"every training forward: the rollout's {big} scores alive": all(big in [s for s, _ in t] for t in trains),
        f"second micro-batch of a mini-batch: the previous micro-batch's two {(b, r, v)} tensors alive":
            sorted(s for s, _ in trains[1]) == [(b, r, v), (b, r, v), big],
        "first micro-batch of a mini-batch: nothing of an earlier micro-batch": [s for s, _ in trains[0]] == [big],
    }
    for text, ok in checks.items():
        print(("ok   " if ok else "FAIL ") + text)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/trl112"))
