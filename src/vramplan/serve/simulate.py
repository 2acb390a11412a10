"""Request-level simulation of KV-cache use under continuous batching.

A stream of requests (prompt tokens, output tokens, arrival step) is replayed through an
iteration-level scheduler (Orca / vLLM style: every engine step each running request
decodes one token, and waiting requests join as soon as they fit), in one of two modes:

* ``contiguous``: each request reserves, when admitted, one contiguous range of token
  slots for its whole life (``reservation``: ``max`` = max_model_len as Orca (Max) and
  FasterTransformer do, ``pow2`` = the next power of two of its final length, ``oracle`` =
  exactly its final length), placed first-fit in a linear address space.
* ``paged``: PagedAttention; blocks of ``block_size`` tokens are taken on demand as a
  request grows.  When a running request needs a block and none is free, the most
  recently admitted request is preempted and recomputed later (vLLM V1's policy: its
  blocks are freed and it re-enters the front of the queue with prompt = prompt + tokens
  generated so far).  With ``shared_prefix`` > 0 every prompt starts with the same
  tokens and their full blocks are stored once (prefix caching).

Timeline of one request admitted at step a with prompt p and output o (vLLM's): the
prefill step a writes p cache slots and samples token 1; each later step writes the
previous token's slot and samples the next; it finishes after step a + o - 1 holding
p + o - 1 slots, and its memory is free for step a + o.  Admission is first come, first
served: the queue stops at the first request that does not fit.  A step's prefill tokens
are limited by ``max_num_batched_tokens`` minus the running decodes (a prompt larger than
the budget runs alone in its step: vLLM would split it into chunks).

Memory at each step, in token slots:

* used: slots holding token states (shared prefix blocks counted once);
* reservation: slots reserved for tokens a request will still write (contiguous);
* internal: slots that will never hold a token: the unused end of a contiguous
  reservation, the unfilled tail of a request's last block (paged);
* external: free slots left idle while the head of the queue waits for memory;
* occupied = used + reservation + internal + external; waste = 1 - used / occupied.

These are summed over every step in which work is running or waiting (so time-weighted),
and reported with the concurrent sequences over time, the preemptions and a throughput
proxy (output tokens per engine step).  Kwon et al. (SOSP 2023, section 3 and Fig. 2)
measured that existing systems store token states in only 20.4%-38.2% of the KV memory
(60-80% waste) and that vLLM's waste is under 4%.

Speed: between events (an admission, a finish, an arrival to an empty queue, a block
shortage) the running set only grows by one token per request per step, so those steps
are summed in closed form (per-residue counts of when each request crosses a block
boundary), and 100,000 requests take a few seconds.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Literal

from vramplan.errors import Problem, ScenarioError
from vramplan.serve.workloads import Trace
from vramplan.units import ceil_div

__all__ = ["SimConfig", "SimResult", "simulate", "simulate_both"]

Mode = Literal["paged", "contiguous"]
Reservation = Literal["max", "pow2", "oracle"]


@dataclass(frozen=True)
class SimConfig:
    capacity_tokens: int  # KV slots on one GPU (num_gpu_blocks * block_size)
    mode: Mode = "paged"
    block_size: int = 16
    max_model_len: int = 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    reservation: Reservation = "max"
    shared_prefix: int = 0
    timeline_points: int = 2000  # cap on recorded (step, running, used, occupied) points


@dataclass
class SimResult:
    mode: str
    config: SimConfig
    requests: int
    rejected: int
    finished: int
    steps: int
    busy_steps: int
    preemptions: int
    output_tokens: int
    used_slot_steps: int
    reservation_slot_steps: int
    internal_slot_steps: int
    external_slot_steps: int
    running_steps: int  # sum over steps of running sequences
    max_running: int
    timeline: dict[str, list[int]] = field(default_factory=dict)

    @property
    def occupied_slot_steps(self) -> int:
        return self.used_slot_steps + self.reservation_slot_steps + self.internal_slot_steps + self.external_slot_steps

    def share(self, part: str) -> float:
        """A part's share of the occupied memory (time-weighted)."""
        occ = self.occupied_slot_steps
        value = {"used": self.used_slot_steps, "reservation": self.reservation_slot_steps,
                 "internal": self.internal_slot_steps, "external": self.external_slot_steps}[part]
        return value / occ if occ else 0.0

    @property
    def waste(self) -> float:
        """1 - token states / occupied memory."""
        return 1.0 - self.share("used") if self.occupied_slot_steps else 0.0

    @property
    def utilisation(self) -> float:
        """Token states over the whole KV capacity, averaged over busy steps."""
        denom = self.config.capacity_tokens * self.busy_steps
        return self.used_slot_steps / denom if denom else 0.0

    @property
    def mean_running(self) -> float:
        return self.running_steps / self.busy_steps if self.busy_steps else 0.0

    @property
    def throughput(self) -> float:
        """Output tokens per engine step (the throughput proxy)."""
        return self.output_tokens / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, object]:
        c = self.config
        return {
            "mode": self.mode, "capacity_tokens": c.capacity_tokens, "block_size": c.block_size,
            "reservation": c.reservation if self.mode == "contiguous" else None, "max_model_len": c.max_model_len,
            "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens,
            "shared_prefix": c.shared_prefix, "requests": self.requests, "rejected": self.rejected,
            "finished": self.finished, "steps": self.steps, "busy_steps": self.busy_steps,
            "preemptions": self.preemptions, "output_tokens": self.output_tokens,
            "kv_utilisation": round(self.utilisation, 6), "token_state_share": round(self.share("used"), 6),
            "waste": round(self.waste, 6), "reservation_waste": round(self.share("reservation"), 6),
            "internal_waste": round(self.share("internal"), 6), "external_waste": round(self.share("external"), 6),
            "mean_running": round(self.mean_running, 4), "max_running": self.max_running,
            "throughput_tokens_per_step": round(self.throughput, 6),
            "slot_steps": {"used": self.used_slot_steps, "reservation": self.reservation_slot_steps,
                           "internal": self.internal_slot_steps, "external": self.external_slot_steps},
        }


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class _Intervals:
    """Free token ranges of a linear address space, first-fit, merged on free."""

    def __init__(self, size: int) -> None:
        self.starts: list[int] = [0]
        self.ends: list[int] = [size]
        self.free = size

    def alloc(self, n: int) -> int | None:
        for i, (a, b) in enumerate(zip(self.starts, self.ends, strict=True)):
            if b - a >= n:
                if b - a == n:
                    del self.starts[i], self.ends[i]
                else:
                    self.starts[i] = a + n
                self.free -= n
                return a
        return None

    def release(self, a: int, n: int) -> None:
        b = a + n
        i = bisect.bisect_left(self.starts, a)
        if i > 0 and self.ends[i - 1] == a:
            i -= 1
            self.ends[i] = b
        else:
            self.starts.insert(i, a)
            self.ends.insert(i, b)
        if i + 1 < len(self.starts) and self.starts[i + 1] == self.ends[i]:
            self.ends[i] = self.ends[i + 1]
            del self.starts[i + 1], self.ends[i + 1]
        self.free += n


# Steps replayed one at a time (the others are summed in closed form): bounded so that no setting makes a
# replay run for minutes or its timeline grow without end (issue 19).  The bundled workloads need about three
# per request (100,000 ShareGPT or arXiv requests: 139,191 - 279,537), so the cap leaves them three times
# room; a token budget that leaves no room to admit a request beside the running decodes (e.g.
# --max-num-batched-tokens 1) makes every decode step explicit and reaches it.
MAX_EXPLICIT_STEPS = 1_000_000


def _step_cap_problem(finished: int, n: int) -> Problem:
    return Problem("--requests", f"the replay stepped through {MAX_EXPLICIT_STEPS:,} engine steps one at a time and "
                   f"finished {finished:,} of {n:,} requests; a simulation replays at most {MAX_EXPLICIT_STEPS:,}",
                   "fewer --requests, or a --max-num-batched-tokens that admits prompts beside the running "
                   "decodes")


def _check(cfg: SimConfig) -> None:
    problems = []
    if cfg.capacity_tokens < 1:
        problems.append(Problem("capacity", f"KV capacity must be >= 1 token, got {cfg.capacity_tokens}",
                                "give --capacity-tokens or a model and GPU that leave room for the KV cache"))
    if cfg.block_size < 1:
        problems.append(Problem("--block-size", f"must be >= 1, got {cfg.block_size}", ""))
    if cfg.max_model_len < 2:
        problems.append(Problem("--max-model-len", f"must be >= 2, got {cfg.max_model_len}", ""))
    if cfg.max_num_seqs < 1 or cfg.max_num_batched_tokens < 1:
        problems.append(Problem("--max-num-seqs", "max_num_seqs and max_num_batched_tokens must be >= 1", ""))
    if cfg.capacity_tokens < cfg.max_model_len:
        problems.append(Problem(
            "capacity", f"the KV capacity ({cfg.capacity_tokens} tokens) cannot hold one request of max_model_len "
            f"({cfg.max_model_len}); vLLM would refuse to start", "lower --max-model-len or give more KV capacity"))
    if cfg.shared_prefix < 0:
        problems.append(Problem("--shared-prefix", f"must be >= 0, got {cfg.shared_prefix}", ""))
    elif cfg.shared_prefix >= cfg.max_model_len >= 2:
        # a prompt holds at most max_model_len - 1 tokens (one is left to generate): a longer shared prefix
        # cannot be part of every prompt
        problems.append(Problem(
            "--shared-prefix", f"{cfg.shared_prefix:,} shared tokens, but --max-model-len {cfg.max_model_len:,} "
            f"leaves a prompt at most {cfg.max_model_len - 1:,}", "lower --shared-prefix or raise --max-model-len"))
    if problems:
        raise ScenarioError(problems)


def simulate(trace: Trace, cfg: SimConfig) -> SimResult:
    """Replay ``trace`` under ``cfg``; deterministic (no randomness inside)."""
    _check(cfg)
    paged = cfg.mode == "paged"
    B = cfg.block_size
    n = len(trace)
    max_len = cfg.max_model_len
    arrival: list[int] = list(trace.arrival)
    # clip to the context: prompt <= max_len - 1, final length p + o - 1 <= max_len
    prompt: list[int] = [min(p, max_len - 1) for p in trace.prompt]
    if cfg.shared_prefix:
        prompt = [max(p, min(cfg.shared_prefix, max_len - 1)) for p in prompt]
    output: list[int] = [max(1, min(o, max_len - p + 1)) for p, o in zip(prompt, trace.output, strict=True)]
    final: list[int] = [p + o - 1 for p, o in zip(prompt, output, strict=True)]
    cap = cfg.capacity_tokens
    total_blocks = cap // B
    shared_blocks = cfg.shared_prefix // B if paged else 0
    shared_tok = shared_blocks * B

    def need_slots(rid: int) -> int:
        return final[rid] if paged else reserve(rid)

    def reserve(rid: int) -> int:
        if cfg.reservation == "max":
            return max_len
        if cfg.reservation == "pow2":
            return min(max_len, _pow2(final[rid]))
        return final[rid]

    # running-request state
    run: OrderedDict[int, None] = OrderedDict()  # admission order, for preemption
    start: dict[int, int] = {}  # s: cache length after step u is u - s
    finish: dict[int, int] = {}  # last step the request runs
    out_left: dict[int, int] = {}  # outputs still to produce at admission
    res_start: dict[int, int] = {}  # contiguous: address of its reservation
    res_len: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    cnt = [0] * B  # running requests that need a new block at steps v with v % B == r
    S = 0  # sum of s over running requests
    N = 0
    sum_blocks = 0  # sum of ceil(len / B) over running requests (paged, before prefix dedupe)
    sum_res = 0  # contiguous: reserved slots
    sum_final = 0  # final lengths of running requests
    space = _Intervals(cap)
    cur_prompt = list(prompt)
    cur_output = list(output)

    waiting: deque[int] = deque()
    nxt = 0  # next request not yet arrived
    t = 0
    preemptions = rejected = finished = 0
    output_tokens = 0
    used_ss = res_ss = int_ss = ext_ss = run_ss = 0
    busy = 0
    max_running = 0
    blocked_by_memory = False
    blocked_by_budget = False
    tl_step: list[int] = []
    tl_run: list[int] = []
    tl_used: list[int] = []
    tl_occ: list[int] = []
    # a request whose whole life cannot fit in the KV capacity can never run: reject it up front
    too_big = [need_slots(i) > (total_blocks * B if paged else cap) for i in range(n)]

    def used_blocks() -> int:
        return sum_blocks - max(0, N - 1) * shared_blocks

    def remove(rid: int) -> None:
        nonlocal S, N, sum_blocks, sum_res, sum_final
        s = start.pop(rid)
        run.pop(rid)
        finish.pop(rid)
        out_left.pop(rid)
        S -= s
        N -= 1
        sum_final -= cur_prompt[rid] + cur_output[rid] - 1
        if paged:
            cnt[(s + 1) % B] -= 1
        else:
            space.release(res_start.pop(rid), res_len[rid])
            sum_res -= res_len.pop(rid)

    def admit(rid: int, step: int) -> None:
        nonlocal S, N, sum_blocks, sum_res, sum_final
        p, o = cur_prompt[rid], cur_output[rid]
        s = step - p
        run[rid] = None
        start[rid] = s
        finish[rid] = step + o - 1
        out_left[rid] = o
        heapq.heappush(heap, (step + o - 1, rid))
        S += s
        N += 1
        sum_final += p + o - 1
        if paged:
            cnt[(s + 1) % B] += 1
            sum_blocks += ceil_div(p, B)

    def accumulate(t0: int, t1: int) -> None:
        """Add steps [t0, t1) in which the running set only grows (closed form)."""
        nonlocal used_ss, res_ss, int_ss, ext_ss, run_ss, busy, sum_blocks, output_tokens
        k = t1 - t0
        if k <= 0:
            return
        if N == 0 and not waiting:
            return
        busy += k
        run_ss += N * k
        output_tokens += N * k
        steps_sum = (t0 + t1 - 1) * k // 2
        used_raw = N * steps_sum - S * k
        dedupe = max(0, N - 1) * shared_tok * k
        used = used_raw - dedupe
        used_ss += used
        if paged:
            # sum over u in [t0, t1) of blocks(u) = k*blocks(t0-1) + sum_v cnt[v % B] * (t1 - v)
            blocks_sum = k * sum_blocks
            grow = 0
            for d in range(B):
                v0 = t0 + d
                if v0 >= t1:
                    break
                c = cnt[v0 % B]
                if not c:
                    continue
                m = (t1 - 1 - v0) // B + 1
                last = v0 + (m - 1) * B
                blocks_sum += c * (m * t1 - (v0 + last) * m // 2)
                grow += c * m
            alloc = (blocks_sum - max(0, N - 1) * shared_blocks * k) * B
            int_ss += alloc - used
            if blocked_by_memory and waiting:
                ext_ss += (total_blocks * k - (blocks_sum - max(0, N - 1) * shared_blocks * k)) * B
            sum_blocks += grow
        else:
            res_ss += sum_final * k - used_raw
            int_ss += (sum_res - sum_final) * k
            if blocked_by_memory and waiting:
                ext_ss += space.free * k

    def record(step: int) -> None:
        if paged:
            occ = used_blocks() * B
        else:
            occ = sum_res
        tl_step.append(step)
        tl_run.append(N)
        tl_used.append(N * step - S - max(0, N - 1) * shared_tok)
        tl_occ.append(occ)

    explicit = 0
    while True:
        explicit += 1
        if explicit > MAX_EXPLICIT_STEPS:
            raise ScenarioError([_step_cap_problem(finished, n)])
        # ---- one explicit step at t ----
        while nxt < n and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if paged and N:
            need = cnt[t % B]
            free = total_blocks - used_blocks()
            while need > free and run:
                victim = next(reversed(run))
                s = start[victim]
                length = (t - 1) - s
                if (s + 1) % B == t % B:
                    need -= 1
                generated = out_left[victim] - (finish[victim] - (t - 1))
                sum_blocks -= ceil_div(length, B)
                remove(victim)
                cur_prompt[victim] = cur_prompt[victim] + generated
                cur_output[victim] = cur_output[victim] - generated
                waiting.appendleft(victim)
                preemptions += 1
                free = total_blocks - used_blocks()
            sum_blocks += need
        budget = cfg.max_num_batched_tokens - N
        admitted_any = False
        blocked_by_memory = blocked_by_budget = False
        while waiting and N < cfg.max_num_seqs:
            rid = waiting[0]
            if too_big[rid]:
                waiting.popleft()
                rejected += 1
                continue
            p = cur_prompt[rid]
            if p > budget and (admitted_any or budget <= 0):
                blocked_by_budget = True  # next step has a fresh budget
                break
            if paged:
                needb = ceil_div(p, B) - (shared_blocks if N > 0 else 0)
                if needb > total_blocks - used_blocks():
                    blocked_by_memory = True
                    break
            else:
                size = reserve(rid)
                addr = space.alloc(size)
                if addr is None:
                    blocked_by_memory = True
                    break
                res_start[rid] = addr
                res_len[rid] = size
                sum_res += size
            waiting.popleft()
            admit(rid, t)
            budget -= p
            admitted_any = True
        if N == 0 and waiting and blocked_by_memory:  # nothing runs and the head still does not fit
            waiting.popleft()
            rejected += 1
        max_running = max(max_running, N)
        # metrics for step t: requests admitted at t hold p slots, the others grew by one
        if N or waiting:
            record(t)
            # accumulate() expects sum_blocks at end of step t-1 for the range [t, t+1):
            # step t's growth is already in sum_blocks, so count the step directly
            busy += 1
            run_ss += N
            used_raw = N * t - S
            used = used_raw - max(0, N - 1) * shared_tok
            used_ss += used
            if paged:
                alloc = used_blocks() * B
                int_ss += alloc - used
                if blocked_by_memory and waiting:
                    ext_ss += (total_blocks - used_blocks()) * B
            else:
                res_ss += sum_final - used_raw
                int_ss += sum_res - sum_final
                if blocked_by_memory and waiting:
                    ext_ss += space.free
        output_tokens += N
        # finishes at the end of step t
        freed = False
        while heap and heap[0][0] <= t:
            f, rid = heapq.heappop(heap)
            if finish.get(rid) != f:
                continue  # stale entry of a preempted request
            if paged:
                sum_blocks -= ceil_div(t - start[rid], B)
            remove(rid)
            finished += 1
            freed = True
        t += 1
        if N == 0 and not waiting and nxt >= n:
            break
        # ---- quiet steps [t, t2): nothing but growth ----
        t2 = t + (1 << 62)
        while heap and finish.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        if heap:
            t2 = min(t2, heap[0][0])  # the finishing step itself is explicit
        if waiting and (freed or blocked_by_budget or N == 0 or not blocked_by_memory and N < cfg.max_num_seqs):
            t2 = t  # the head may be admitted at the next step
        if nxt < n and not waiting:
            t2 = min(t2, arrival[nxt])
        if paged and N and t2 > t:
            free = total_blocks - used_blocks()
            q, rem = divmod(free, N)
            u = t + q * B
            acc = 0
            while u < t2:
                acc += cnt[u % B]
                if acc > rem:
                    break
                u += 1
            t2 = min(t2, u)
        if t2 > t:
            accumulate(t, t2)
            t = t2
    steps = t
    tl = _thin({"step": tl_step, "running": tl_run, "used": tl_used, "occupied": tl_occ}, cfg.timeline_points)
    return SimResult(
        mode=cfg.mode, config=cfg, requests=n, rejected=rejected, finished=finished, steps=steps, busy_steps=busy,
        preemptions=preemptions, output_tokens=output_tokens, used_slot_steps=used_ss, reservation_slot_steps=res_ss,
        internal_slot_steps=int_ss, external_slot_steps=ext_ss, running_steps=run_ss, max_running=max_running,
        timeline=tl,
    )


def _thin(tl: dict[str, list[int]], points: int) -> dict[str, list[int]]:
    n = len(tl["step"])
    if n <= points or points <= 0:
        return tl
    idx = [round(i * (n - 1) / (points - 1)) for i in range(points)] if points > 1 else [n - 1]
    return {k: [v[i] for i in idx] for k, v in tl.items()}


def simulate_both(trace: Trace, cfg: SimConfig) -> tuple[SimResult, SimResult]:
    """The same trace with contiguous reservations and with paged blocks."""
    from dataclasses import replace

    return simulate(trace, replace(cfg, mode="contiguous")), simulate(trace, replace(cfg, mode="paged"))
