"""measure/breakdown.py: the peak of an event stream and its content by part (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from vramplan.measure import breakdown as bd


@dataclass(frozen=True)
class Ev:
    storage_id: int
    nbytes: int
    category: str


def stream() -> list[Ev]:
    # the module's worked example, with a backward gradient and an optimizer state after it
    return [
        Ev(0, 100, bd.WEIGHTS),     # live 100
        Ev(1, 40, bd.FORWARD),      # 140
        Ev(2, 60, bd.FORWARD),      # 200  <- peak
        Ev(1, -40, bd.FORWARD),     # 160
        Ev(3, 10, bd.BACKWARD),     # 170 (a gradient: alive at the end)
        Ev(4, 30, bd.BACKWARD),     # 200 (ties the peak; the first maximum wins)
        Ev(4, -30, bd.BACKWARD),    # 170
        Ev(2, -60, bd.FORWARD),     # 110
        Ev(5, 20, bd.OPTIMIZER),    # 130 (a state: alive at the end)
        Ev(6, 5, bd.OPTIMIZER),     # 135 (a step temporary)
        Ev(6, -5, bd.OPTIMIZER),    # 130
    ]


def test_find_peak_first_maximum() -> None:
    p = bd.find_peak(stream())
    assert p == bd.Peak(2, 200)


def test_find_peak_window_and_base() -> None:
    ev = stream()
    # from event 4 on, with 160 bytes live before: 170, 200, 170, ... -> 200 after event 5
    assert bd.find_peak(ev, 4, None, base_bytes=160) == bd.Peak(5, 200)
    assert bd.find_peak([], 0) == bd.Peak(-1, 0)


def test_live_at_and_classify_at_peak() -> None:
    ev = stream()
    end = bd.live_at(ev, len(ev) - 1)
    assert end == {0: (bd.WEIGHTS, 100), 3: (bd.BACKWARD, 10), 5: (bd.OPTIMIZER, 20)}
    at_peak = bd.classify(bd.live_at(ev, 2), end, optimizer_name="adamw")
    assert at_peak == {"weights": {"parameters": 100}, "activations": {"forward tensors": 100}}
    # just after event 5: weights 100, activation 60, gradient 10, backward temporary 30
    later = bd.classify(bd.live_at(ev, 5), end)
    assert later == {"weights": {"parameters": 100}, "activations": {"forward tensors": 60},
                     "gradients": {"parameter gradients": 10}, "temporaries": {"backward": 30}}
    step = bd.classify(bd.live_at(ev, 9), end, optimizer_name="adamw")
    assert step["optimizer_states"] == {"adamw": 20} and step["temporaries"] == {"optimizer step": 5}


def test_classify_fixed_and_unknown_categories() -> None:
    alive = {1: (bd.AUTOCAST, 8), 2: (bd.LOGITS, 16), 3: (bd.KV_CACHE, 32), 4: (bd.INPUTS, 4),
             5: (bd.BUFFERS, 2), 6: (bd.PREFILL, 64), 7: ("mystery", 1), 8: (bd.OPTIMIZER_STATES, 128)}
    out = bd.classify(alive, [], optimizer_name="sgd-momentum")
    assert out == {
        "temporaries": {"autocast weight copies": 8, "logits and loss": 16},
        "kv_cache": {"cache": 32},
        "other": {"inputs": 4, "buffers": 2, "mystery": 1},
        "activations": {"running layer": 64},
        "optimizer_states": {"sgd-momentum": 128},
    }


def test_phase_peaks_and_phase_of() -> None:
    ev = stream()
    marks = [(1, "forward"), (4, "backward"), (8, "optimizer")]
    # set-up (event 0) = 100; forward reaches 200; backward 200 (events 4-7); optimizer 135
    assert bd.phase_peaks(ev, marks) == {"forward": 200, "backward": 200, "optimizer": 135}
    assert bd.phase_of(2, marks) == "forward"
    assert bd.phase_of(0, marks) == "setup"
    assert bd.phase_of(10, marks) == "optimizer"
    # a phase that repeats (gradient accumulation) keeps its highest value
    assert bd.phase_peaks(ev, [(1, "forward"), (4, "backward"), (6, "forward")])["forward"] == 200


@st.composite
def events(draw: st.DrawFn) -> list[Ev]:
    """A valid stream: each storage allocated once, maybe freed later."""
    out: list[Ev] = []
    live: dict[int, int] = {}
    for sid in range(draw(st.integers(0, 25))):
        if live and draw(st.booleans()):
            victim = draw(st.sampled_from(sorted(live)))
            out.append(Ev(victim, -live.pop(victim), "x"))
        n = draw(st.integers(1, 1000))
        live[sid] = n
        out.append(Ev(sid, n, draw(st.sampled_from([bd.WEIGHTS, bd.FORWARD, bd.BACKWARD, bd.OPTIMIZER]))))
    return out


@given(events())
def test_peak_is_the_maximum_prefix_sum_and_its_breakdown_adds_up(ev: list[Ev]) -> None:
    prefix = [sum(e.nbytes for e in ev[: i + 1]) for i in range(len(ev))]
    p = bd.find_peak(ev)
    assert p.bytes == max([0, *prefix])
    alive = bd.live_at(ev, p.index)
    assert sum(n for _, n in alive.values()) == p.bytes
    parts = bd.classify(alive, bd.live_at(ev, len(ev) - 1))
    assert sum(sum(d.values()) for d in parts.values()) == p.bytes
