"""A slow, step-by-step reference of the simulator's rules, for cross-checking the fast one."""

from __future__ import annotations

from collections import deque

from vramplan.serve.simulate import SimConfig
from vramplan.serve.workloads import Trace


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def reference(trace: Trace, cfg: SimConfig) -> dict[str, int]:
    paged = cfg.mode == "paged"
    B = cfg.block_size
    L_max = cfg.max_model_len
    n = len(trace)
    prompts = [min(int(p), L_max - 1) for p in trace.prompt]
    outputs = [max(1, min(int(o), L_max - p + 1)) for p, o in zip(prompts, trace.output)]
    if cfg.shared_prefix:
        prompts = [max(p, min(cfg.shared_prefix, L_max - 1)) for p in prompts]
        outputs = [max(1, min(o, L_max - p + 1)) for p, o in zip(prompts, outputs)]
    arrival = [int(a) for a in trace.arrival]
    cap = cfg.capacity_tokens
    total_blocks = cap // B
    sb = cfg.shared_prefix // B if paged else 0

    def reserve(p: int, o: int) -> int:
        f = p + o - 1
        if cfg.reservation == "max":
            return L_max
        if cfg.reservation == "pow2":
            return min(L_max, 1 << max(0, (f - 1).bit_length()))
        return f

    final0 = [p + o - 1 for p, o in zip(prompts, outputs)]
    too_big = [(final0[i] > total_blocks * B) if paged else (reserve(prompts[i], outputs[i]) > cap) for i in range(n)]
    cur_p, cur_o = list(prompts), list(outputs)
    running: list[dict[str, int]] = []  # admission order
    free_ranges = [[0, cap]]
    waiting: deque[int] = deque()
    nxt = t = 0
    m = {k: 0 for k in ("used", "reservation", "internal", "external", "running", "busy", "preemptions", "rejected",
                        "finished", "output", "max_running")}

    def blocks_used() -> int:
        return sum(_ceil(r["L"], B) for r in running) - max(0, len(running) - 1) * sb

    def alloc(size: int) -> int | None:
        for fr in free_ranges:
            if fr[1] - fr[0] >= size:
                a = fr[0]
                fr[0] += size
                if fr[0] == fr[1]:
                    free_ranges.remove(fr)
                return a
        return None

    def release(a: int, size: int) -> None:
        free_ranges.append([a, a + size])
        free_ranges.sort()
        merged: list[list[int]] = []
        for fr in free_ranges:
            if merged and merged[-1][1] == fr[0]:
                merged[-1][1] = fr[1]
            else:
                merged.append(fr)
        free_ranges[:] = merged

    while True:
        while nxt < n and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        # decode growth of the running requests
        if paged:
            needers = [r for r in running if r["L"] % B == 0]
            while len(needers) > total_blocks - blocks_used() and running:
                v = running.pop()
                if v in needers:
                    needers.remove(v)
                g = v["done"]
                cur_p[v["id"]] += g
                cur_o[v["id"]] -= g
                waiting.appendleft(v["id"])
                m["preemptions"] += 1
        for r in running:
            r["L"] += 1
        budget = cfg.max_num_batched_tokens - len(running)
        any_ad = False
        blocked_mem = False
        while waiting and len(running) < cfg.max_num_seqs:
            rid = waiting[0]
            if too_big[rid]:
                waiting.popleft()
                m["rejected"] += 1
                continue
            p = cur_p[rid]
            if p > budget and (any_ad or budget <= 0):
                break
            rec = {"id": rid, "L": p, "done": 0, "o": cur_o[rid], "final": p + cur_o[rid] - 1}
            if paged:
                if _ceil(p, B) - (sb if running else 0) > total_blocks - blocks_used():
                    blocked_mem = True
                    break
            else:
                size = reserve(p, cur_o[rid])
                a = alloc(size)
                if a is None:
                    blocked_mem = True
                    break
                rec["addr"], rec["R"] = a, size
            waiting.popleft()
            running.append(rec)
            budget -= p
            any_ad = True
        if not running and waiting and blocked_mem:
            waiting.popleft()
            m["rejected"] += 1
        N = len(running)
        m["max_running"] = max(m["max_running"], N)
        if N or waiting:
            m["busy"] += 1
            m["running"] += N
            raw = sum(r["L"] for r in running)
            used = raw - max(0, N - 1) * sb * B
            m["used"] += used
            if paged:
                m["internal"] += blocks_used() * B - used
                if blocked_mem and waiting:
                    m["external"] += (total_blocks - blocks_used()) * B
            else:
                m["reservation"] += sum(r["final"] for r in running) - raw
                m["internal"] += sum(r["R"] - r["final"] for r in running)
                if blocked_mem and waiting:
                    m["external"] += sum(b - a for a, b in free_ranges)
        m["output"] += N
        for r in list(running):
            r["done"] += 1
            if r["done"] == r["o"]:
                running.remove(r)
                if not paged:
                    release(r["addr"], r["R"])
                m["finished"] += 1
        t += 1
        if not running and not waiting and nxt >= n:
            break
    m["steps"] = t
    return m
