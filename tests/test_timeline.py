"""The step's timeline and the sweep that turns terms into moments (analytic/timeline.py)."""

from __future__ import annotations

import pytest

from vramplan.analytic.moment import K, Moment
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.timeline import (
    END,
    FORWARD,
    LOSS,
    STEP,
    TIED_EMBEDDING,
    Loc,
    attention,
    layer_done,
    mlp,
    step_timeline,
    sweep,
    sweep_totals,
)


def test_locations_order_backward_runs_from_the_last_layer() -> None:
    order = [FORWARD, LOSS, mlp(1), attention(1), layer_done(1), mlp(0), attention(0), layer_done(0),
             TIED_EMBEDDING, STEP, END]
    assert sorted(order, key=lambda loc: loc.order) == order
    with pytest.raises(ValueError, match="unknown location"):
        Loc("checkpoint")


def test_step_timeline_points() -> None:
    # 2 layers, the head, layer 1 splits its backward, layer 0 does not, a tied embedding
    tl = step_timeline(2, True, [False, True], True)
    assert [(p.loc, p.phase) for p in tl.points] == [
        (FORWARD, "forward"), (LOSS, "backward"), (mlp(1), "backward"), (attention(1), "backward"),
        (mlp(0), "backward"), (TIED_EMBEDDING, "backward"), (STEP, "optimizer")]
    # a stage without the head and without a tied embedding: no loss point, no embedding point
    tl = step_timeline(1, False, [False], False)
    assert [p.loc for p in tl.points] == [FORWARD, mlp(0), STEP]


def test_sweep_sums_the_terms_alive_at_each_point() -> None:
    shown = frozenset({K.LAYER_BACKWARD})
    tl = step_timeline(2, True, [False, True], False, shown)
    terms = [
        resident(K.PARAMETERS, 100, "parameters"),
        Term(K.SAVED, 10, FORWARD, layer_done(0), "saved.kept", 0),
        Term(K.SAVED, 20, FORWARD, layer_done(1), "saved.kept", 1),
        Term(K.SAVED, -5, attention(1), layer_done(1), "saved.freed_before_attention", 1),
        Term(K.LOSS_BACKWARD, 40, LOSS, mlp(1), "logits.loss_gradients"),
        Term(K.OPTIMIZER_STEP, 7, STEP, END, "optimizer.step"),
        Term(K.MASTER, 9, FORWARD, END, "master", where="host"),  # not on the device: in no moment
    ]
    moments = sweep(terms, tl)
    # forward 100 + 10 + 20 = 130; loss 130 + 40 = 170; layer 1 MLP 130; layer 1 attention
    # 130 - 5 = 125; layer 0 MLP 100 + 10 = 110 (layer 1's saved tensors are gone); step 100 + 7 = 107
    assert [mo.total for mo in moments] == [130, 170, 130, 125, 110, 107]
    assert [mo.phase for mo in moments] == ["forward", "backward", "backward", "backward", "backward", "optimizer"]
    assert moments[3].get(K.SAVED) == 25  # 10 + 20 - 5
    # the attention point shows its layer temporaries' row at 0 bytes; the other points leave it out
    assert moments[3].parts["temporaries"] == {"layer backward": 0}
    assert "temporaries" not in moments[2].parts
    # a key whose terms are all gone is left out: no saved row at the optimizer step
    assert "activations" not in moments[5].parts


def test_terms_check_their_lifetime_and_tensors() -> None:
    with pytest.raises(ValueError, match="before it is born"):
        Term(K.SAVED, 1, mlp(0), mlp(1), "x")  # layer 1's backward comes before layer 0's
    with pytest.raises(ValueError, match="tensors sum"):
        Term(K.LOSS_FORWARD, 10, FORWARD, LOSS, "x", tensors=(3, 4))
    with pytest.raises(ValueError, match="where"):
        resident(K.PARAMETERS, 1, "x", where="disk")


def test_swept_moments_read_like_set_ones_and_total_what_they_hold() -> None:
    tl = step_timeline(1, True, [False], False)
    terms = [
        resident(K.PARAMETERS, 100, "parameters"),
        Term(K.SAVED, 10, FORWARD, layer_done(0), "saved.kept", 0),
        Term(K.LOSS_BACKWARD, 40, LOSS, mlp(0), "logits.loss_gradients"),
        Term(K.OPTIMIZER_STEP, 7, STEP, END, "optimizer.step"),
    ]
    moments, totals = sweep_totals(terms, tl)
    # forward 100 + 10 = 110; loss 110 + 40 = 150; layer 0 MLP 110; step 100 + 7 = 107
    assert totals == [110, 150, 110, 107]
    loss = Moment("backward").set(K.PARAMETERS, 100).set(K.SAVED, 10).set(K.LOSS_BACKWARD, 40)
    assert moments[1].parts == loss.parts and moments[1].phase == loss.phase
    assert list(moments[1].parts) == ["weights", "activations", "temporaries"]  # the terms' order
    # a moment added to after the sweep totals what it then holds: 107 + 3 = 110
    assert moments[3].add(K.OPTIMIZER_STEP, 3).total == 110
    assert moments[3].copy("optimizer").parts == {"weights": {"parameters": 100}, "temporaries": {"optimizer step": 10}}
