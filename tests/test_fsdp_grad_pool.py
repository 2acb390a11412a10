"""torch FSDP's gradients on the reduce-scatter stream: a pool of their own in the caching allocator
(analytic/terms/sharding.py ``grads_on_reduce_stream``, alloc/compact.py ``split_pools``, analytic/allocator.py
``_pooled_reserved``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.alloc import replay_compact
from vramplan.alloc.compact import split_pools
from vramplan.analytic.allocator import train_reserved_bytes
from vramplan.analytic.events import train_run_pools, train_run_stream
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.units import MiB

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _fsdp(**over: Any) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "llama3-8b-fsdp-8xh100.yaml").read_text())
    for key, value in over.items():
        section, _, field = key.partition(".")
        if field:
            doc.setdefault(section, {})[field] = value
        else:
            doc[section] = value
    return {**doc, "offline": True}


def test_worked_example_one_stream_reuses_two_streams_do_not() -> None:
    # a 20 MiB activation (block 0) freed, then a 20 MiB gradient (block 1): 20 MiB is above the 10 MiB small-segment
    # limit, so each request opens a segment of its own rounded to 2 MiB = 20 MiB.  One stream: the gradient takes
    # the cached block, 20 MiB reserved.  The gradient on its own stream: 20 + 20 = 40 MiB.
    stream = [20 * MiB, -1, 20 * MiB, -2]
    assert replay_compact(stream).peak_reserved_bytes == 20 * MiB
    main, side = split_pools(stream, {1})
    assert main == [20 * MiB, -1] and side == [20 * MiB, -1]
    assert replay_compact(main).peak_reserved_bytes + replay_compact(side).peak_reserved_bytes == 40 * MiB


events = st.lists(st.integers(1, 64 * MiB), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(sizes=events, data=st.data())
def test_split_keeps_every_event_of_each_block(sizes: list[int], data: st.DataObject) -> None:
    # allocate every size, each free of a live block drawn after its allocation (interleaved); a drawn set of blocks
    # on the side stream
    stream: list[int] = []
    live: list[int] = []
    for i, size in enumerate(sizes):
        stream.append(size)
        live.append(i)
        for b in data.draw(st.lists(st.sampled_from(live), unique=True)):
            stream.append(-b - 1)
            live.remove(b)
    stream += [-b - 1 for b in live]
    marked = data.draw(st.sets(st.integers(0, len(sizes) - 1)))
    main, side = split_pools(stream, marked)
    assert sorted(x for x in side if x > 0) == sorted(sizes[i] for i in marked)
    # each part's events are the whole stream's of its blocks, in order, ids renumbered by allocation order
    for part, keep in ((main, lambda b: b not in marked), (side, lambda b: b in marked)):
        ids = [i for i in range(len(sizes)) if keep(i)]
        new_id = {b: k for k, b in enumerate(ids)}
        expected, bid = [], 0
        for x in stream:
            if x > 0:
                if keep(bid):
                    expected.append(x)
                bid += 1
            elif keep(-x - 1):
                expected.append(-new_id[-x - 1] - 1)
        assert part == expected
    assert len(main) + len(side) == len(stream)
    # each part is a well-formed compact stream: every free names a live block of its own part
    for part in (main, side):
        r = replay_compact(part)
        assert r.unmatched_frees == 0 and r.final_allocated_bytes == 0
    whole = replay_compact(stream)
    if not marked:
        assert main == stream and side == []
    # at every event the requested bytes of the whole are those of the parts together, so the parts' peaks sum to at
    # least the whole's (allocated bytes would not do: a block handed out whole depends on what else is cached)
    assert replay_compact(main).peak_requested_bytes + replay_compact(side).peak_requested_bytes >= \
        whole.peak_requested_bytes


def _grads_only(doc: dict[str, Any]) -> Any:
    """The step's layout without the reduce-dtype blocks (``test_reduce_outputs_are_blocks_of_the_pool`` has them):
    the gradients alone on the side stream."""
    lay = train_step(resolve(doc)).layout
    assert lay is not None
    return replace(lay, grad_reduce_ratio=(0, 1))


def test_fsdp_gradients_are_marked_and_their_pool_holds_them_all() -> None:
    lay = _grads_only(_fsdp())
    assert lay.grads_on_side_stream
    main, side = train_run_pools(lay)
    # the two parts are the whole stream's events
    assert sorted(x for x in main + side if x > 0) == sorted(x for x in train_run_stream(lay) if x > 0)
    # the gradient pool holds every sharded gradient of a step at the optimizer step: the layers' gradients and
    # those outside them, as the layout gives them (the pool's peak rounds each block up to 512 B)
    grads = sum(lt.grad for lt in lay.layers) + lay.grad_outside
    peak = replay_compact(side).peak_allocated_bytes
    blocks = sum(1 for x in side if x > 0) // 2   # two steps
    assert grads <= peak <= grads + 512 * blocks


def test_fsdp_reserved_is_the_sum_of_the_pools_and_allocated_is_unchanged() -> None:
    tr = train_step(resolve(_fsdp()))
    lay = tr.layout
    assert lay is not None
    one = replace(lay, grads_on_side_stream=False)
    alloc_two, reserved_two = train_reserved_bytes(lay)
    alloc_one, reserved_one = train_reserved_bytes(one)
    # pooling leaves the allocated bytes those of the same stream replayed in one pool, exactly
    assert alloc_two == replay_compact(train_run_stream(lay)).peak_allocated_bytes
    # against the single-stream layout, whose gradients are a block per parameter (the pool's a block per unit): the
    # same bytes, rounded to 512 B per block apart (a few hundred KiB on 8B's 291 parameters)
    assert abs(alloc_two - alloc_one) <= MiB
    main, side = train_run_pools(lay)
    assert reserved_two == replay_compact(main).peak_reserved_bytes + replay_compact(side).peak_reserved_bytes
    # the activations freed late in the backward held gradients on one stream; apart, the gradients need their own
    # segments: more reserved
    assert reserved_two > reserved_one


def test_no_pool_where_gradients_stay_on_the_compute_stream() -> None:
    # DeepSpeed ZeRO (its own reduction buffers), CPU offload (the gradients leave the GPU), and FSDP1 unsharded
    # (no_shard, or one rank, which FSDP1 clamps to NO_SHARD) with the parameters in the compute dtype (fp32 here;
    # the HF Trainer's bf16-true under FSDP keeps fp32 parameters, accelerate's upcast): ``.grad`` is all-reduced in
    # place on the compute stream and never cast (torch 2.13 _runtime_utils.py :932-947); torchtune before v0.3.0
    # wrapped its model in FSDP1 and runs bf16-true with bf16 parameters
    fsdp1_true = {"framework": "hf-trainer", "train": {**_fsdp()["train"], "precision": "fp32"}}
    tune = {"framework": "torchtune", "software": {"torchtune": "0.2.1"},
            "train": {**_fsdp()["train"], "precision": "bf16-true", "attention": "sdpa"}}
    for doc in (
        {**_fsdp(parallel={"zero_stage": 3}), "framework": "deepspeed"},
        _fsdp(**{"parallel.offload": "optimizer"}),
        {**_fsdp(**{"parallel.fsdp": "no_shard"}), **fsdp1_true},
        {**_fsdp(**{"hardware.num_gpus": 1}), **fsdp1_true},
        {**_fsdp(**{"hardware.num_gpus": 1}), **tune},
    ):
        lay = train_step(resolve(doc)).layout
        assert lay is not None and not lay.grads_on_side_stream, doc


def test_unsharded_gradients_take_the_side_stream_where_torch_fsdp_makes_them_there() -> None:
    # FSDP2 (accelerate as exported, torchtune >= 0.3) runs foreach_reduce on one rank too: reduce_output is made
    # under the reduce-scatter stream (torch 2.13 _fsdp_collectives.py :611-631); FSDP1 unsharded under mixed
    # precision casts .grad to the fp32 parameter dtype on the post-backward stream (_runtime_utils.py :1048)
    fsdp1 = {"framework": "hf-trainer"}
    tune = {"framework": "torchtune", "software": {"torchtune": "0.3.0"},
            "train": {**_fsdp()["train"], "precision": "bf16-true", "attention": "sdpa"}}
    for doc in (
        _fsdp(**{"hardware.num_gpus": 1}),
        {**_fsdp(**{"hardware.num_gpus": 1}), **fsdp1},
        {**_fsdp(**{"parallel.fsdp": "no_shard"}), **fsdp1},
        {**_fsdp(**{"hardware.num_gpus": 1}), **tune},
    ):
        tr = train_step(resolve(doc))
        assert tr.layout is not None and tr.layout.grads_on_side_stream, doc
        rep = estimate(resolve(doc))
        assert any("reduce-scatter stream" in a for a in rep.assumptions), doc


def test_a_units_gradients_are_one_block_in_their_pool() -> None:
    # FSDP2's reduce_output per parameter group (each .grad a view of it), FSDP1's flat sharded gradient per unit:
    # the side stream allocates one block per layer a step, plus the head's and the embedding's
    lay = _grads_only(_fsdp())
    _, side = train_run_pools(lay)
    outside = (lay.grad_outside - lay.embed_grad > 0) + (lay.embed_grad > 0)
    assert sum(1 for x in side if x > 0) == 2 * (len(lay.layers) + outside)  # two steps
    # each layer's block is its unit's whole gradient shard: the layer terms' gradient bytes, in the backward's order
    first_step = [x for x in side if x > 0][: len(lay.layers) + outside]
    layer_blocks = [x for x in first_step if x not in (lay.grad_outside - lay.embed_grad, lay.embed_grad)]
    assert layer_blocks == [lt.grad for lt in reversed(lay.layers)]


def test_adapters_gradients_take_the_pool_too() -> None:
    # LoRA under FSDP: FSDP2 reduces only the parameters that require grad, FSDP1 under PEFT's auto-wrap policy
    # wraps the adapters as units of their own: the side pool holds the adapters' gradients, a few MiB
    lay = _grads_only(_fsdp(**{"train.peft": {"method": "lora", "rank": 16}}))
    assert lay.grads_on_side_stream
    _, side = train_run_pools(lay)
    grads = sum(lt.grad for lt in lay.layers) + lay.grad_outside
    assert 0 < grads == sum(x for x in side if x > 0) // 2 < 200 * MiB


def test_estimate_reports_the_pooled_reserved_bytes() -> None:
    r = resolve(_fsdp())
    rep = estimate(r)
    tr = train_step(r)
    assert tr.layout is not None
    main, side = train_run_pools(tr.layout)
    pooled = replay_compact(main).peak_reserved_bytes + replay_compact(side).peak_reserved_bytes
    assert rep.per_gpu.peak_reserved_bytes >= pooled
    assert any("reduce-scatter stream" in a for a in rep.assumptions)


def test_every_step_marks_its_gradients() -> None:
    # two steps: each makes (and frees at its optimizer step) every gradient, so the side stream allocates twice the
    # gradient tensors of one backward; with gradient accumulation the second micro-batch's gradients are made at
    # the first optimizer step (they exist through the second forward) and are marked too
    for accum in (1, 2):
        lay = _grads_only(_fsdp(**{"train.grad_accum_steps": accum}))
        _, side = train_run_pools(lay)
        per_step = sum(1 for x in train_run_stream(replace(lay, grads_during_forward=False)) if x > 0)
        one = [x for x in side if x > 0]
        assert len(one) % 2 == 0
        grads = sum(lt.grad for lt in lay.layers) + lay.grad_outside
        # the side stream's allocations are two steps' gradients, each step's summing to the layout's gradients
        assert sum(one) == 2 * grads, accum
        assert per_step > len(one)


def test_accumulated_gradients_reuse_the_first_steps_blocks() -> None:
    # the gradients that gradient accumulation finds are made in the backward's order and sizes, so in their own pool
    # they reuse the blocks the first step's gradients left: the pool reserves what one step's gradients need
    one = _grads_only(_fsdp())
    two = _grads_only(_fsdp(**{"train.grad_accum_steps": 2}))
    assert two.grads_during_forward
    assert replay_compact(train_run_pools(two)[1]).peak_reserved_bytes == \
        replay_compact(train_run_pools(one)[1]).peak_reserved_bytes


def test_capacity_caps_the_pools_sum() -> None:
    # the pools' sum above the device: the real allocator releases every stream's free segments and retries; the
    # single-stream replay fits, so the reserved bytes are the capacity
    lay = train_step(resolve(_fsdp())).layout
    assert lay is not None
    _, one = train_reserved_bytes(replace(lay, grads_on_side_stream=False))
    _, two = train_reserved_bytes(lay)
    cap = (one + two) // 2
    assert train_reserved_bytes(lay, capacity_bytes=cap)[1] == cap
    assert train_reserved_bytes(lay, capacity_bytes=two + 1)[1] == two


def test_reduce_outputs_are_blocks_of_the_pool() -> None:
    # accelerate reduces in the mixed-precision dtype (set_mixed_precision: reduce_dtype = dtype): each unit's bf16
    # reduce output is made on the side stream, the fp32 gradient cast from it, then the bf16 block freed. A step
    # allocates two blocks per unit there; at the embedding's (the last unit) every other gradient is alive beside its
    # reduce output, half its bytes; the pool reserves more than the gradients alone
    lay = train_step(resolve(_fsdp())).layout
    assert lay is not None and lay.grad_reduce_ratio == (2, 4)
    _, side = train_run_pools(lay)
    outside = (lay.grad_outside - lay.embed_grad > 0) + (lay.embed_grad > 0)
    assert sum(1 for x in side if x > 0) == 2 * 2 * (len(lay.layers) + outside)
    grads = sum(lt.grad for lt in lay.layers) + lay.grad_outside
    assert replay_compact(side).peak_allocated_bytes >= grads + lay.embed_grad // 2
    alone = replace(lay, grad_reduce_ratio=(0, 1))
    assert replay_compact(side).peak_reserved_bytes > replay_compact(train_run_pools(alone)[1]).peak_reserved_bytes
    # one rank under the HF Trainer's FSDP1 (accelerate's MixedPrecision(bf16, bf16, bf16)): the same blocks
    one = train_step(resolve({**_fsdp(**{"hardware.num_gpus": 1}), "framework": "hf-trainer"})).layout
    assert one is not None and one.grad_reduce_ratio == (2, 4)
    # torchtitan reduces in fp32 (no cast); a plain script's reduce dtype is not known: no such block
    titan = {**_fsdp(), "framework": "torchtitan", "train": {**_fsdp()["train"], "attention": "sdpa"}}
    for doc in (titan, {**_fsdp(), "framework": "plain"}):
        lay = train_step(resolve(doc)).layout
        assert lay is not None and lay.grads_on_side_stream and lay.grad_reduce_ratio == (0, 1), doc["framework"]


def test_an_unread_reduce_dtype_is_stated() -> None:
    # a plain script's FSDP reduce dtype is its own: its reduce outputs are not counted, and the report says so;
    # accelerate's is read (set_mixed_precision), so its report does not
    said = "FSDP reduce dtype is its script's"
    assert any(said in a for a in estimate(resolve({**_fsdp(), "framework": "plain"})).assumptions)
    assert not any(said in a for a in estimate(resolve(_fsdp())).assumptions)
