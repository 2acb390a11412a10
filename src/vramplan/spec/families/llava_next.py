"""LLaVA-NeXT (``model_type: llava_next``, ``LlavaNextForConditionalGeneration``).

transformers 5.24 ``models/llava_next/modeling_llava_next.py``: LLaVA's vision tower, projector and language model
(spec/families/llava.py builds them) and ``image_newline``, a learned d_text vector.  What differs is the image
path ("anyres"): ``LlavaNextImageProcessor`` resizes and pads each image to the ``image_grid_pinpoints``
resolution ``select_best_resolution`` picks, cuts it into tiles of the tower's ``image_size`` and adds the whole
image at that size, so the tower runs once per tile and once for the base image (``image_size_to_num_patches``);
``pack_image_features`` unpads the tiles' features to the image's aspect ratio and appends ``image_newline`` after
each row, and ``LlavaNextProcessor._get_number_of_features`` writes that many image tokens
(spec/vision.py ``anyres_grid``).  ``LlavaNextConfig``'s default grid is [[336, 672], [672, 336], [672, 672],
[1008, 336], [336, 1008]].
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family
from vramplan.spec.families.llava import llava_spec
from vramplan.spec.model import ModelSpec

__all__ = ["LLAVA_NEXT"]

# LlavaNextConfig's image_grid_pinpoints default (configuration_llava_next.py)
DEFAULT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    given = cfg.get("image_grid_pinpoints")
    pinpoints = tuple((int(h), int(w)) for h, w in given) if given else DEFAULT_PINPOINTS
    return llava_spec(cfg, model_type, name, anyres=pinpoints)


LLAVA_NEXT = Family(build, "modeling_llava_next.py", required=(("vision_config",),), text_model_type="llama")
