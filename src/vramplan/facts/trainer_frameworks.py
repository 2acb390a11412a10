"""Fine-tuning frameworks that run the HF Trainer with their own model preparation, as data (``framework``).

axolotl and LLaMA-Factory build ``TrainingArguments`` and train with (a subclass of) the HF Trainer, so every
convention of ``framework: hf-trainer`` applies to them (``Scenario.effective_framework``) except what each does to
a bitsandbytes (k-bit) base before the adapters are added, which decides the dtype of every non-quantized parameter
(embeddings, norms, LM head) and so of the residual stream, the norms' outputs and the head's autocast copy:

* **hf-trainer** (TRL's and the PEFT examples' scripts): ``peft.prepare_model_for_kbit_training`` casts every
  non-quantized fp16/bf16 parameter to fp32 (peft ``utils/other.py``) and the step holds them so
  (``analytic/terms/context.py`` ``StepContext.kbit``).
* **axolotl** (``src/axolotl/loaders/model.py`` ``ModelLoader._configure_embedding_dtypes`` at 067b021, 2026-07; the
  same steps in ``src/axolotl/utils/models.py`` ``load_model`` from v0.3.0 of 2023-09-11): with ``adapter: lora`` or
  ``qlora`` it runs ``prepare_model_for_kbit_training`` and then, because ``needs_fa2_dtype`` is true for every LoRA
  adapter ("LlamaRMSNorm layers are in fp32 after kbit_training ..., so we need to convert them back to fp16/bf16"),
  converts every module whose name holds ``norm`` and the embedding modules (``embed_tokens``, ``lm_head``:
  ``get_linear_embedding_layers``) back to ``torch_dtype`` (``_convert_embedding_modules_dtype``).  So the step holds
  them in the half dtype, and the preparation phase makes each fp32 copy and then each half copy again.  Under
  QLoRA with FSDP or under ZeRO-3 it skips the preparation (``_prepare_model_for_quantization``), where the planner's
  load path does not quantize on the GPU anyway.
* **llamafactory** (``src/llamafactory/model/model_utils/checkpointing.py`` ``prepare_model_for_training`` at
  ff6d4d1, 2026-08; from v0.2.0 of 2023-10-15, commit 3198a7e "refactor model_dtype"): it never calls
  ``prepare_model_for_kbit_training``; norms are cast to fp32 only with ``upcast_layernorm: true`` (default false,
  ``hparams/model_args.py``), embeddings and head stay in the load dtype.  Its other defaults (gradient
  checkpointing on unless ``disable_gradient_checkpointing``) are the scenario's own keys: set them as the run did.

axolotl converts back only modules whose name holds ``norm`` and its embedding names (``get_linear_embedding_layers``:
``embed_tokens`` and ``lm_head`` but for GPT-NeoX, Falcon and Nemotron-H), so the step holds everything in the half
dtype only for models whose adapter sets ``Traits.norm_embed_names`` (the dense Llama-style families: every parameter
bitsandbytes leaves unquantized is an embedding, the head, a norm or a quantized linear's bias, which
``Linear4bit.forward`` casts to its input's dtype on the first call; checked on transformers' modules built on the
meta device, ``tests/test_trainer_frameworks.py``).  Other types keep peft's fp32 casts in the estimate (GPT-J's ``wte``,
GPT-2's ``ln_1``, OPT's ``embed_positions`` stay fp32; MoE experts that bitsandbytes does not quantize would be
cast to fp32 whole), said so.  Without a k-bit base axolotl still upcasts the embeddings, the head and the norms
to fp32 after loading, then casts them back for the adapter (``needs_fa2_dtype``): a load-time copy of them, the
preparation phase of a LoRA run on a half base.  axolotl's evaluation batch defaults to its micro-batch
(``src/axolotl/utils/config/__init__.py``: ``cfg.eval_batch_size = cfg.micro_batch_size``), not the HF Trainer's 8.

LLaMA-Factory's ``upcast_layernorm: true`` (which its parser recommends for quantized training) leaves fp32 norm
weights whose outputs, and so every linear's output, are fp32: not modelled; ``framework: hf-trainer`` counts fp32
norms and embeddings, an upper bound of it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TRAINER_FRAMEWORKS", "TrainerFramework", "trainer_framework"]


@dataclass(frozen=True)
class TrainerFramework:
    """A framework that runs the HF Trainer with its own preparation of a k-bit base.

    ``runs_as`` is the framework whose conventions apply otherwise (``Scenario.effective_framework``);
    ``kbit_prepares`` says it calls ``peft.prepare_model_for_kbit_training`` on a bitsandbytes base (the fp32 casts
    of the preparation phase), ``casts_back`` that it then converts the norms and embeddings back to the model's
    dtype, so the step holds them in it; ``since`` is the first release with this behaviour (earlier ones are
    estimated as it, said so) and ``source`` where it was read; ``eval_batch_is_micro_batch``: its evaluation batch
    defaults to the training micro-batch (else the HF Trainer's 8)."""

    name: str
    runs_as: str
    kbit_prepares: bool
    casts_back: bool
    since: str
    source: str
    eval_batch_is_micro_batch: bool = False


TRAINER_FRAMEWORKS: tuple[TrainerFramework, ...] = (
    TrainerFramework("axolotl", "hf-trainer", kbit_prepares=True, casts_back=True, since="0.3.0",
                     source="axolotl-ai-cloud/axolotl src/axolotl/loaders/model.py _configure_embedding_dtypes "
                            "(067b021); src/axolotl/utils/models.py load_model at v0.3.0",
                     eval_batch_is_micro_batch=True),
    TrainerFramework("llamafactory", "hf-trainer", kbit_prepares=False, casts_back=False, since="0.2.0",
                     source="hiyouga/LLaMA-Factory src/llamafactory/model/model_utils/checkpointing.py "
                            "prepare_model_for_training (ff6d4d1); upcast_layernorm default false from v0.2.0"),
)


def trainer_framework(name: str | None) -> TrainerFramework | None:
    """The row of ``name``, or None for a framework that is not one of these."""
    return next((f for f in TRAINER_FRAMEWORKS if f.name == name), None)
