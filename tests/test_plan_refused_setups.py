"""The planner skips the setups the estimator refuses for a model, says so, and checks the job's own length.

Before: ``vramplan plan`` on Whisper resolved the model with the schema's default seq_len (2,048) and was refused
(its decoder has 448 learned positions) whatever the job's length; and the search's fast path, which builds
scenarios without the estimator's checks, chose FSDP setups that ``vramplan estimate`` refuses for an
encoder-decoder model, so the plan ended with that refusal instead of a setup.
"""

from __future__ import annotations

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.plan.search import plan
from vramplan.plan.space import TrainJob


def test_the_job_length_is_checked_not_the_default() -> None:
    # 256 target tokens fit Whisper's 448 positions: planned; 1,024 do not: the model's own refusal
    assert plan("openai/whisper-tiny", "A100-40GB", 1, TrainJob(seq_len=256, global_batch=4), top=1).fits
    with pytest.raises(ScenarioError, match="448"):
        plan("openai/whisper-tiny", "A100-40GB", 1, TrainJob(seq_len=1024, global_batch=4), top=1)


def test_refused_setups_are_skipped_and_counted() -> None:
    r = plan("openai/whisper-tiny", "A100-40GB", 2, TrainJob(seq_len=256, global_batch=8), top=3)
    assert r.fits and r.chosen is not None
    # every ranked setup is one `vramplan estimate` accepts: FSDP and ZeRO-3 are refused for encoder-decoder models
    for s in [r.chosen, *r.runners_up]:
        assert s.setup["fsdp"] == "none" and s.setup["zero_stage"] in (0, 2), s.label
        resolve(s.scenario)  # raises ScenarioError if refused
    note = next(n for n in r.notes if "the estimator refuses them" in n)
    assert "parallel.fsdp" in note and int(note.split(" ", 1)[0].replace(",", "")) > 0
