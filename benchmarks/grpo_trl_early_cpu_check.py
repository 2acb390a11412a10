"""Runs the log-probability functions of TRL's own GRPOTrainer, as shipped in the wheels of 0.15.2, 0.16.1, 0.20.0,
0.23.1 and 1.0.0, on the CPU and checks which logits-sized tensors are alive when ``selective_log_softmax`` and
``entropy_from_logits`` run, as analytic/grpo.py ``grpo_loss_tensors`` models each release (facts/trl.py
``GRPO_EARLY_ROWS``, docs/rl.md "GRPO before v1.9.0").

The project's environment has TRL 1.16.0, whose trainer module cannot import an older one's, so the check takes the
source of ``GRPOTrainer._get_per_token_logps`` (``_get_per_token_logps_and_entropies`` from 0.20) and of
``utils.py`` ``selective_log_softmax`` and ``entropy_from_logits`` out of each unzipped wheel and runs them as they are
(with torch, on a stand-in model: a linear head over random hidden states, whose backward saves its input and weight
and never its output, as a transformers LM head does):

    for v in 0.15.2 0.16.1 0.20.0 0.23.1 1.0.0; do pip download trl==$v --no-deps -d /tmp/trlw; done
    (cd /tmp/trlw && for w in *.whl; do unzip -q -o $w 'trl/trainer/*' -d ${w%-py3-none-any.whl}; done)
    python benchmarks/grpo_trl_early_cpu_check.py /tmp/trlw

One line per check; output with torch 2.13.0 (CPU): every check ``ok``.
"""

from __future__ import annotations

import ast
import gc
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

B, P, C, V, H = 3, 5, 7, 97, 16

# release -> (the head's b (C + 1) V logits alive at selective_log_softmax, a contiguous quotient, entropy input
# contiguous): analytic/grpo.py grpo_loss_tensors
EXPECTED = {
    "0.15.2": (True, False, None),
    "0.16.1": (False, True, None),
    "0.20.0": (False, True, True),
    "0.23.1": (False, True, True),
    "1.0.0": (True, False, False),
}


def _source(path: Path, name: str, method: bool) -> str:
    tree = ast.parse(path.read_text())
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    seg = ast.get_source_segment(path.read_text(), nodes[0])
    assert seg is not None
    return textwrap.dedent(seg) if method else seg


def _storages(numel: int) -> list[tuple[int, bool]]:
    import torch

    out: dict[int, bool] = {}
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.untyped_storage().nbytes() == numel * o.element_size():
                out[o.untyped_storage().data_ptr()] = o.is_contiguous() and o.dim() == 3
        except Exception:  # noqa: BLE001, S112
            continue
    return list(out.items())


def check(root: Path, release: str) -> list[str]:
    import torch
    import torch.nn.functional as F

    tree = root / f"trl-{release}" / "trl" / "trainer"
    trainer, utils = tree / "grpo_trainer.py", tree / "utils.py"
    ns: dict[str, Any] = {"torch": torch, "F": F, "nullcontext": None}
    exec(_source(utils, "selective_log_softmax", False), ns)  # noqa: S102
    entropy_src = "entropy_from_logits" in utils.read_text()
    if entropy_src:
        exec(_source(utils, "entropy_from_logits", False), ns)  # noqa: S102
    seen: dict[str, Any] = {}
    real_sls, real_ent = ns["selective_log_softmax"], ns.get("entropy_from_logits")

    def sls(logits: Any, index: Any) -> Any:
        seen["head_alive"] = any(True for _ in _storages(B * (C + 1) * V))
        seen["quotient"] = any(contig for _, contig in _storages(B * C * V))
        return real_sls(logits, index)

    def ent(logits: Any, *a: Any, **k: Any) -> Any:
        seen["entropy_contiguous"] = logits.is_contiguous()
        return real_ent(logits, *a, **k)

    ns["selective_log_softmax"], ns["entropy_from_logits"] = sls, ent
    name = "_get_per_token_logps_and_entropies" if "def _get_per_token_logps_and_entropies" in trainer.read_text() \
        else "_get_per_token_logps"
    fn_src = _source(trainer, name, True)
    exec(fn_src, ns)  # noqa: S102
    fn = ns[name]
    torch.manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False)

    def model(input_ids: Any, attention_mask: Any = None, logits_to_keep: int = 0, **_: Any) -> Any:
        assert logits_to_keep == C + 1
        hidden = torch.randn(input_ids.shape[0], logits_to_keep, H)
        return SimpleNamespace(logits=head(hidden))

    # the model takes logits_to_keep (transformers' causal LMs): TRL asks for the last C + 1 positions only
    me = SimpleNamespace(temperature=0.7, model_kwarg_keys={"logits_to_keep"})
    ids = torch.randint(0, V, (B, P + C))
    kwargs: dict[str, Any] = {"batch_size": B} if "batch_size" in fn_src else {}
    if "compute_entropy" in fn_src:
        kwargs["compute_entropy"] = True
    out = fn(me, model, ids, torch.ones_like(ids), C, **kwargs)
    logps = out if isinstance(out, torch.Tensor) else out[0]
    logps.sum().backward()
    head_alive, quotient, contiguous = EXPECTED[release]
    got = (seen["head_alive"], seen["quotient"], seen.get("entropy_contiguous"))
    want = (head_alive, quotient, contiguous)
    verdict = "ok" if got == want else f"MISMATCH (expected {want})"
    return [(f"{release}: {name}: head logits alive {got[0]}, contiguous quotient {got[1]}, entropy input contiguous "
             f"{got[2]}: {verdict}")]


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/trlw")
    lines = [line for release in EXPECTED for line in check(root, release)]
    print("\n".join(lines))
    return 0 if all(line.endswith("ok") for line in lines) else 1


if __name__ == "__main__":
    raise SystemExit(main())
