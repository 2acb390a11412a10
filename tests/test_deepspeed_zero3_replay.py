"""DeepSpeed ZeRO-3 in the training step's allocator replay (analytic/events.py): the gathered parameters on the
all-gather stream, a pool of their own (terms/deepspeed.py ``gathers_on_side_stream``), and the optimizer's flat
buffers per sub-group (``zero3_sub_groups``)."""

from __future__ import annotations

from typing import Any

from vramplan.alloc import replay_compact
from vramplan.analytic.events import train_run_pools, train_run_stream
from vramplan.analytic.terms.deepspeed import SUB_GROUP_SIZE, zero3_sub_groups
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve


def _doc(**parallel: Any) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-2-7b-hf", "framework": "deepspeed", "offline": True,
            "hardware": {"gpu": "A100-80GB", "num_gpus": parallel.pop("gpus", 2)},
            "parallel": {"zero_stage": 3, **parallel},
            "train": {"precision": "bf16-mixed", "seq_len": 512, "micro_batch_size": 1}}


def _layout(doc: dict[str, Any]) -> Any:
    tr = train_step(resolve(doc))
    assert tr.layout is not None and tr.context is not None
    return tr


def test_sub_groups_of_the_partition() -> None:
    # Llama-2-7B, 6,738,415,616 parameters over 2 ranks: 3,369,207,808 each: three sub-groups of 1e9 and the rest,
    # 369,207,808 (stage3.py _create_fp16_sub_groups, sub_group_size 1e9); over 8 ranks 842,301,952: one
    tr = _layout(_doc())
    assert zero3_sub_groups(tr.context) == (SUB_GROUP_SIZE,) * 3 + (369_207_808,)
    assert tr.layout.zero3_groups == zero3_sub_groups(tr.context)
    assert zero3_sub_groups(_layout(_doc(gpus=8)).context) == (842_301_952,)
    # parameters offloaded: the optimizer's flat buffers live on the host, nothing here
    assert zero3_sub_groups(_layout(_doc(offload="optimizer+params")).context) == ()


def test_parameters_are_one_flat_buffer_and_masters_one_per_sub_group() -> None:
    # defragment: the partitions as one block of 3,369,207,808 x 2 B = 6,738,415,616 (the sum of the per-tensor
    # partition bytes the layout holds); then per sub-group its bf16 clone (2 B) and fp32 master (4 B)
    tr = _layout(_doc())
    lay = tr.layout
    params = sum(lay.param_tensors) + sum(sum(lay.layers[i % len(lay.layers)].params) for i in range(len(lay.layers)))
    stream = train_run_stream(lay)
    assert params in stream
    masters = [4 * g for g in lay.zero3_groups]
    assert lay.master == sum(masters) == 4 * 3_369_207_808
    for m in masters:
        assert m in stream and m // 2 in stream
    # the per-tensor masters of the other engines are not there: the first master block follows the flat parameters
    first = stream.index(params)
    assert stream[first + 1:].count(4 * SUB_GROUP_SIZE) >= 3


def test_gathered_parameters_are_a_pool_of_their_own() -> None:
    # overlap_comm (true at stage 3): the gathered block is replayed apart; the side pool holds exactly its blocks
    tr = _layout(_doc())
    lay = tr.layout
    assert lay.gathered_on_side_stream and lay.gathered > 0
    main, side = train_run_pools(lay)
    assert side and sum(x for x in side if x > 0) == 2 * lay.gathered  # allocated in each of the two steps' passes
    # the sum of the pools' reserved bytes is at least the one-stream replay's allocated peak
    one = replay_compact(train_run_stream(lay))
    assert replay_compact(main).peak_reserved_bytes + replay_compact(side).peak_reserved_bytes >= one.peak_allocated_bytes
    # overlap_comm false: DeepSpeed gathers on the default stream, one pool
    assert not _layout(_doc(deepspeed={"overlap_comm": False})).layout.gathered_on_side_stream


def test_the_optimizer_steps_one_sub_group_at_a_time() -> None:
    # stage3.py _optimizer_step hands torch's AdamW one sub-group's flat fp32 partition per step(): its foreach
    # temporaries are the largest sub-group's.  Over 2 ranks the partition is 3,369,207,808 elements in sub-groups of
    # 1e9: the step's temporaries are 1e9 / 3,369,207,808 of the whole partition's; over 8 ranks (one sub-group of
    # 842,301,952) all of them
    from vramplan.analytic.terms.optimizer_state import optimizer_cost_of, step_temporary

    c = _layout({**_doc(), "framework": "hf-trainer"}).context
    whole = optimizer_cost_of(c).step_temporary_bytes
    assert whole > 0
    step = next(t for t in step_temporary(c) if t.name == "optimizer.step")
    assert step.nbytes == whole * 1_000_000_000 // 3_369_207_808
    c8 = _layout({**_doc(gpus=8), "framework": "hf-trainer"}).context
    assert next(t for t in step_temporary(c8) if t.name == "optimizer.step").nbytes == \
        optimizer_cost_of(c8).step_temporary_bytes
    # the replay: each sub-group's temporaries in turn, the largest's bytes scaled to each (369,207,808 for the last)
    lay = _layout({**_doc(), "framework": "hf-trainer"}).layout
    stream = train_run_stream(lay)
    assert stream.count(lay.step_temporary) == 2 * 3  # three full sub-groups, in each of the two steps
    assert lay.step_temporary * 369_207_808 // SUB_GROUP_SIZE in stream
