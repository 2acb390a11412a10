"""Run in a subprocess by tests/test_encdec_train.py with an unpacked transformers 4.x first on sys.path: the analytic
and the traced peak of a T5 step under that release's eager T5Attention, and the parameters of its model against the
spec's, printed as JSON.  transformers 4.x takes
``torch_dtype``, not ``dtype``, and lacks transformers 5's ``maybe_autocast`` and ``masking_utils`` patch points
(trace/step.py), so stand-ins are put there (4.x's T5 calls neither)."""
# ruff: noqa
import json, sys
import transformers
from transformers import AutoModelForSeq2SeqLM
_orig = AutoModelForSeq2SeqLM.from_config.__func__
def _from_config(cls, config, **kw):
    if "dtype" in kw:
        kw["torch_dtype"] = kw.pop("dtype")
    return _orig(cls, config, **kw)
AutoModelForSeq2SeqLM.from_config = classmethod(_from_config)
# the trace's patch points of transformers 5 that 4.x lacks: stand-ins it replaces and restores
import contextlib, types
from transformers.utils import generic
if not hasattr(generic, "maybe_autocast"):
    generic.maybe_autocast = lambda *a, **k: contextlib.nullcontext()
try:
    import transformers.masking_utils as mu
except ImportError:
    mu = types.ModuleType("transformers.masking_utils")
    sys.modules["transformers.masking_utils"] = mu
    transformers.masking_utils = mu
for name, stand_in in (("find_packed_sequence_indices", lambda p: None), ("fast_all", lambda t: True)):
    if not hasattr(mu, name):
        setattr(mu, name, stand_in)
from vramplan.engine import estimate
from vramplan.trace.engine import estimate as traced
T5={"model_type": "t5", "d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8,"d_kv": 64, "vocab_size": 32128, "feed_forward_proj": "relu"}
d={"model":T5,"hardware":{"gpu":"H100-80GB"},"task":"train","software":{"transformers":transformers.__version__},"train":{"precision":"bf16-mixed","micro_batch_size":4,"seq_len":128,"source_len":512,"attention":"eager"}}
d["model"] = json.loads(sys.argv[1])
d["train"].update(json.loads(sys.argv[2]))
a=estimate(d).per_gpu.peak_allocated_bytes; t=traced(d); 
# the release's own model on the meta device: its parameters (``parameters()`` counts a tied tensor once) against the
# spec's for this release (spec/families/t5.py untied_head)
import torch
from transformers import AutoConfig
from vramplan.catalog.resolve import resolve
with torch.device("meta"):
    built = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model(**d["model"]))
params = sum(p.numel() for p in built.parameters())
print(json.dumps({"transformers": transformers.__version__, "analytic": a, "traced": t.per_gpu.peak_allocated_bytes,
                  "parameters": params, "spec_parameters": resolve(d).model.num_parameters}))
