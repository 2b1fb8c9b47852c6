"""The reference engine itself (:class:`Engine`): the continuous-batching loop, the simulator's
scheduler rule for rule, replaying a trace on one of its clocks."""

from __future__ import annotations

import queue
import random
import statistics
import threading
import time
from collections import deque
from typing import Any

from .attention import chunk_attention
from .config import CLOCKS, PROBE_EVERY_S, PROBE_WINDOW, EngineConfig, load_torch
from .kv_memory import NO_SPACE, OVERFLOW, BlockPool, StaticArena
from .model import Transformer
from .records import EngineRequest, EngineResult
from .speed_probe import SpeedProbe, prefill_weight


class Engine:
    def __init__(self, cfg: EngineConfig, model: Transformer | None = None, attention=None):
        """``attention``: an :class:`~calibration.attention_backends.AttentionBackend` to use instead of
        the one ``cfg.kernels`` names (tests: eager flex, a stand-in)."""
        torch = self.torch = load_torch()
        self.cfg = cfg
        if cfg.device == "cpu":
            torch.set_num_threads(int(cfg.threads))
        self.net = model or Transformer(cfg.model, cfg.dtype, cfg.device, cfg.seed)
        m = cfg.model
        KVH, d = m.kv_heads, m.head_dim
        dt, dev = self.net.dtype, self.net.device
        from sim.errors import ConfigError

        from ..attention_backends import make

        #: the paged layout's attention kernels (what ``kvsim calibrate --kernels`` times)
        self.attention = attention or make(cfg.kernels, torch, dev, key="engine.kernels")
        shape: tuple[int, ...]
        if cfg.allocator == "paged":  # blocks past num_blocks (flex rounds the pool up) are never handed out
            shape = (self.attention.pool_blocks(cfg.num_blocks), cfg.block_size, KVH, d)
        else:
            shape = (cfg.capacity_tokens, KVH, d)
        self.k_cache = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(m.layers)]
        self.v_cache = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(m.layers)]
        self._warm = False
        if cfg.allocator == "paged":
            why = self.attention.block_size_problem(cfg.block_size) or self.attention.dtype_problem(dt)
            if why:
                raise ConfigError(
                    "engine.kernels",
                    self.attention.name,
                    f"a backend that runs block {cfg.block_size} in {cfg.dtype} ({why})",
                )
        self.reset()

    def warm_up(self) -> int:
        """Run the paged layout's attention once on every batch shape this engine can form (a compiled
        backend compiles them now, not inside a timed iteration); once per engine. Returns the shapes run."""
        if self._warm or self.cfg.allocator != "paged" or not self.cfg.model.layers:
            return 0
        self._warm = True
        m, cfg = self.cfg.model, self.cfg
        with self.torch.inference_mode():
            return self.attention.warm_up(
                self.k_cache[0],
                self.v_cache[0],
                heads=m.heads,
                kv_heads=m.kv_heads,
                head_dim=m.head_dim,
                max_seqs=cfg.max_num_seqs,
                max_tokens=cfg.max_num_batched_tokens,
                dtype=self.net.dtype,
            )

    def reset(self) -> None:
        cfg = self.cfg
        self.mem: BlockPool | StaticArena
        if cfg.allocator == "paged":
            self.mem = BlockPool(cfg.num_blocks, cfg.block_size)
        else:
            assert cfg.reserve is not None  # EngineConfig sets it for static
            self.mem = StaticArena(cfg.capacity_tokens, int(cfg.reserve), cfg.block_size)
        self.running: list[EngineRequest] = []
        self.waiting: deque[EngineRequest] = deque()
        self._admissions = 0

    # -- scheduling: sim/sched/continuous.py, rule for rule --
    def _preempt_last(self) -> EngineRequest:
        victim = self.running.pop()
        self.mem.release(victim.id)
        victim.computed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def schedule(self):
        cfg, mem, running = self.cfg, self.mem, self.running
        budget = cfg.max_num_batched_tokens
        items: list[tuple[EngineRequest, int]] = []
        ended: list[EngineRequest] = []
        preempted = 0
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            need = len(req.tokens) - req.computed
            if need > budget:
                if not cfg.chunked_prefill:
                    i += 1
                    continue
                need = budget
            r = mem.grow(req.id, req.computed + need)
            while r == NO_SPACE:
                victim = self._preempt_last()
                preempted += 1
                if victim is req:
                    break
                r = mem.grow(req.id, req.computed + need)
            if r == NO_SPACE:
                break
            if r == OVERFLOW:
                running.pop(i)
                mem.release(req.id)
                req.status = "rejected"
                ended.append(req)
                continue
            items.append((req, need))
            budget -= need
            i += 1
        admitted = []
        if preempted == 0:
            waiting = self.waiting
            while waiting and len(running) < cfg.max_num_seqs and budget > 0:
                req = waiting[0]
                need = len(req.tokens)
                if need > budget:
                    if not cfg.chunked_prefill:
                        break
                    need = budget
                r = mem.admit(req.id, need)
                if r == NO_SPACE:
                    break
                waiting.popleft()
                if r == OVERFLOW:
                    req.status = "rejected"
                    ended.append(req)
                    continue
                running.append(req)
                req.seq_no = self._admissions
                self._admissions += 1
                admitted.append(req)
                items.append((req, need))
                budget -= need
        return items, preempted, admitted, ended

    # -- one forward over the scheduled items --
    def execute(self, items: list[tuple[EngineRequest, int]]) -> list[int]:
        """Run the model on ``items``; returns the sampled token of each item that completes its
        sequence (in item order), and -1 for chunks that do not."""
        torch = self.torch
        mem, net = self.mem, self.net
        dev = net.device
        dec = [(r, n) for r, n in items if n == 1 and r.computed + 1 == len(r.tokens) and r.generated > 0]
        dec_ids = {id(r) for r, _ in dec}
        pre = [(r, n) for r, n in items if id(r) not in dec_ids]
        ids, pos, slots = [], [], []
        for r, _ in dec:
            p = r.computed
            ids.append(r.tokens[p])
            pos.append(p)
            slots.append(mem.slot(r.id, p))
        chunk_meta = []
        for r, n in pre:
            c = r.computed
            chunk_meta.append((len(ids), n, c, r))
            ids.extend(r.tokens[c : c + n])
            pos.extend(range(c, c + n))
            slots.extend(mem.slot(r.id, p) for p in range(c, c + n))
        T = len(ids)
        D = len(dec)
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(pos, dtype=torch.long, device=dev)
        slots_t = torch.tensor(slots, dtype=torch.long, device=dev)
        scale = net.scale
        m = self.cfg.model
        KVH, d, H = m.kv_heads, m.head_dim, m.heads
        paged = mem.paged
        chunk_idx: list[int] = []
        if paged:  # each batch's metadata once, for every layer (decode rows first, then the chunks' rows)
            assert isinstance(mem, BlockPool)
            from ..attention_backends import PagedBatch

            att = self.attention
            shape = {
                "heads": H,
                "kv_heads": KVH,
                "head_dim": d,
                "num_blocks": self.k_cache[0].shape[0],
                "dtype": net.dtype,
            }
            dplan = (
                att.plan_paged(
                    PagedBatch.of([mem.tables[r.id] for r, _ in dec], [r.computed for r, _ in dec], [1] * D, mem.B),
                    slot="decode",
                    **shape,
                )
                if D
                else None
            )
            cplan = (
                att.plan_paged(
                    PagedBatch.of(
                        [mem.tables[r.id] for *_, r in chunk_meta],
                        [c for _, _, c, _ in chunk_meta],
                        [n for _, n, _, _ in chunk_meta],
                        mem.B,
                    ),
                    slot="prefill",
                    **shape,
                )
                if chunk_meta
                else None
            )
        else:
            assert isinstance(mem, StaticArena)
            if D:
                dec_span = [(mem.owner[r.id], r.computed + 1) for r, _ in dec]
            chunk_idx = [mem.owner[r.id] for *_, r in chunk_meta]
        kc, vc = self.k_cache, self.v_cache

        def write(li, k, v):
            if paged:
                kc[li].view(-1, KVH, d).index_copy_(0, slots_t, k)
                vc[li].view(-1, KVH, d).index_copy_(0, slots_t, v)
            else:
                kc[li].index_copy_(0, slots_t, k)
                vc[li].index_copy_(0, slots_t, v)

        def attend(li, q):
            if paged:
                if not chunk_meta:  # pure decode
                    return att.paged(dplan, q, kc[li], vc[li], scale)
                out = torch.empty(T, H, d, dtype=q.dtype, device=dev)
                if D:
                    out[:D] = att.paged(dplan, q[:D], kc[li], vc[li], scale)
                out[D:] = att.paged(cplan, q[D:], kc[li], vc[li], scale)  # the chunks' rows follow the decode rows
                return out
            if not chunk_meta:  # pure decode
                return torch.cat(
                    [
                        chunk_attention(q[i : i + 1], kc[li][s : s + L], vc[li][s : s + L], L - 1, scale)
                        for i, (s, L) in enumerate(dec_span)
                    ],
                    0,
                )
            out = torch.empty(T, H, d, dtype=q.dtype, device=dev)
            for i, (s, L) in enumerate(dec_span if D else []):
                out[i : i + 1] = chunk_attention(q[i : i + 1], kc[li][s : s + L], vc[li][s : s + L], L - 1, scale)
            for (off, n, c, _), idx in zip(chunk_meta, chunk_idx):
                L = c + n
                out[off : off + n] = chunk_attention(
                    q[off : off + n], kc[li][idx : idx + L], vc[li][idx : idx + L], c, scale
                )
            return out

        rows, owners = [], []
        for i, (r, _) in enumerate(dec):
            rows.append(i)
            owners.append(r)
        for off, n, c, r in chunk_meta:
            if c + n == len(r.tokens):
                rows.append(off + n - 1)
                owners.append(r)
        logits = net.forward(ids_t, pos_t, attend, write, torch.tensor(rows, dtype=torch.long, device=dev))
        toks = logits.argmax(-1).tolist() if rows else []
        by_req = {id(r): t for r, t in zip(owners, toks)}
        self.last_logits = logits
        return [by_req.get(id(r), -1) for r, _ in items]

    # -- the loop --
    def run(
        self,
        trace,
        *,
        clock: str = "wall",
        cost=None,
        compute: bool = True,
        lead_s: float = 0.05,
        seed: int | None = None,
        max_wall_s: float | None = None,
        probe: SpeedProbe | None = None,
        probe_ref_s: float | None = None,
        probe_every_s: float = PROBE_EVERY_S,
        probe_window: int = PROBE_WINDOW,
        prefill_probe: SpeedProbe | None = None,
        prefill_probe_ref_s: float | None = None,
    ) -> EngineResult:
        """Replay ``trace`` (rows ``(arrival_s, prompt_tokens, output_tokens)``).

        ``clock="wall"``: real time, arrivals fed by a thread at their times. ``clock="cpu"``: the
        engine's own clock, advanced by each iteration's thread CPU time (the real computation,
        timed without the time a shared host kept the thread off the CPU) and jumping to the
        next arrival when idle; arrivals are seen at iteration boundaries. ``clock="virtual"``:
        time advances by ``cost.step_time_s`` per iteration (a sim ``CostModel``, plus its
        allocation charge and its ``after_prefill_s`` as the simulator's replica adds it), arrivals
        are seen when the virtual clock passes them; ``compute=False`` then skips the forward (scheduling and memory only, sampled tokens 0).
        ``clock="cpu_norm"``: the ``cpu`` clock normalised to a reference host speed: every
        ``probe_every_s`` of engine thread CPU time (and ``probe_window`` times before the first
        iteration) ``probe`` (a :class:`SpeedProbe`) runs its fixed iteration; each iteration then
        advances the clock by its thread CPU time × ``probe_ref_s`` ÷ the median of the last
        ``probe_window`` probe times. Probe time is not charged to the clock; the probe series is
        in ``info["speed_probes"]`` and each iteration's factor in its ``speed_scale``. With
        ``prefill_probe`` (a :class:`SpeedProbe` of :data:`PREFILL_PROBE_CHUNKS`, reference
        ``prefill_probe_ref_s``) it runs right before every probe (untimed warm run and all, so the
        engine's next iteration follows the probe as without it) and an iteration's factor is
        ``f ** (1 − w) · f_prefill ** w``, ``w`` = :func:`prefill_weight` of its prefill tokens: a
        prefill is normalised by how prefills, not decodes, slowed.
        """
        torch = self.torch
        if clock not in CLOCKS:
            raise ValueError(f"clock: one of {', '.join(CLOCKS)}")
        if clock == "virtual" and cost is None:
            raise ValueError("clock='virtual' needs a cost model")
        after_s = list(getattr(cost, "after_prefill_s", [])) if clock == "virtual" else []
        after_k = [len(after_s)]  # decode iterations since the last prefill (past the list: none yet)
        norm = clock == "cpu_norm"
        if norm and (probe is None or not probe_ref_s or probe_ref_s <= 0):
            raise ValueError("clock='cpu_norm' needs a SpeedProbe and its reference time probe_ref_s > 0")
        dual = norm and prefill_probe is not None
        if dual and (not prefill_probe_ref_s or prefill_probe_ref_s <= 0):
            raise ValueError("prefill_probe needs its reference time prefill_probe_ref_s > 0")
        cpu_clock = clock in ("cpu", "cpu_norm")
        if compute:
            self.warm_up()
        self.reset()
        rng = random.Random(self.cfg.seed if seed is None else seed)
        vocab = self.cfg.model.vocab
        reqs = [
            EngineRequest(i, a, [rng.randrange(vocab) for _ in range(int(p))], int(o))
            for i, (a, p, o) in enumerate(trace)
        ]
        order = sorted(reqs, key=lambda r: (r.arrival, r.id))
        n_total = len(reqs)
        iters: list[dict] = []
        done = 0
        running, waiting = self.running, self.waiting
        q: queue.SimpleQueue = queue.SimpleQueue()
        feeder = None
        if clock == "wall":
            t0 = time.perf_counter() + lead_s

            def feed():
                for r in order:
                    while True:
                        dt = t0 + r.arrival - time.perf_counter()
                        if dt <= 0:
                            break
                        time.sleep(dt)
                    r.enqueued = time.perf_counter() - t0
                    q.put(r)

            feeder = threading.Thread(target=feed, name="kvsim-feeder", daemon=True)
            feeder.start()
            now = lambda: time.perf_counter() - t0  # noqa: E731
        else:
            vt = [0.0]
            nxt = [0]
            now = lambda: vt[0]  # noqa: E731

        def drain(block: bool) -> None:
            if clock != "wall":
                if block and nxt[0] < n_total and order[nxt[0]].arrival > vt[0]:
                    vt[0] = order[nxt[0]].arrival
                while nxt[0] < n_total and order[nxt[0]].arrival <= vt[0]:
                    r = order[nxt[0]]
                    r.enqueued = r.arrival
                    waiting.append(r)
                    nxt[0] += 1
                return
            if block:
                waiting.append(q.get())
            while True:
                try:
                    waiting.append(q.get_nowait())
                except queue.Empty:
                    return

        wall0 = time.perf_counter()
        scale = scale_pre = 1.0
        probes: list[dict] = []
        window = max(int(probe_window), 1)
        hist: deque[float] = deque(maxlen=window)
        hist_pre: deque[float] = deque(maxlen=window)
        since = [0.0]  # engine thread CPU seconds since the last probe

        def take_probe() -> tuple[float, float]:
            assert probe is not None and probe_ref_s is not None  # checked above for cpu_norm
            q = 0.0
            if dual:
                assert prefill_probe is not None and prefill_probe_ref_s is not None
                # before the probe, so the engine's next iteration still follows the probe alone (right
                # after a prefill probe a decode iteration runs ~18 % slower); the prefill probe itself
                # hardly depends on what ran before it (within 4 %: docs/validation.md)
                q = prefill_probe.measure(warm=False)
                hist_pre.append(q)
            p = probe.measure()
            hist.append(p)
            since[0] = 0.0
            f = float(probe_ref_s) / statistics.median(hist)
            row = {"engine_s": now(), "wall_s": time.perf_counter() - wall0, "probe_s": p, "scale": f}
            f_pre = f
            if dual:
                assert prefill_probe_ref_s is not None
                f_pre = float(prefill_probe_ref_s) / statistics.median(hist_pre)
                row.update(prefill_probe_s=q, prefill_scale=f_pre)
            probes.append(row)
            return f, f_pre

        # whether the next iteration follows a probe (its caches hold the probe's, not the engine's, state)
        probed = False
        if norm:
            for _ in range(window):
                scale, scale_pre = take_probe()
            probed = True
        with torch.inference_mode():
            while done < n_total:
                drain(False)
                if not running and not waiting:
                    drain(True)
                    continue
                if max_wall_s is not None and time.perf_counter() - wall0 > max_wall_s:
                    raise TimeoutError(f"engine run exceeded {max_wall_s} s")
                if norm and since[0] >= probe_every_s:
                    scale, scale_pre = take_probe()
                    probed = True
                ts = now()
                c0 = time.thread_time()
                ev0 = self.mem.events
                items, preempted, admitted, ended = self.schedule()
                for r in admitted:
                    if r.admitted < 0:
                        r.admitted = ts
                blocks = self.mem.blocks_in_use()
                reserved = self.mem.reserved_tokens()
                chunks = [
                    (n, r.computed)
                    for r, n in items
                    if not (n == 1 and r.computed + 1 == len(r.tokens) and r.generated > 0)
                ]
                dec_lens = [
                    r.computed + 1 for r, n in items if n == 1 and r.computed + 1 == len(r.tokens) and r.generated > 0
                ]  # the decoding sequences' KV lengths
                dseqs, dkv = len(dec_lens), sum(dec_lens)
                dmax = max(dec_lens, default=0)  # the longest (what the padded CUDA decode call pads to)
                events = self.mem.events - ev0
                ptoks = sum(n for n, _ in chunks)
                it_scale = scale
                if dual and scale_pre != scale:
                    assert probe is not None and prefill_probe is not None
                    w = prefill_weight(ptoks, probe.prefill_tokens, prefill_probe.prefill_tokens)
                    it_scale = scale ** (1.0 - w) * scale_pre**w
                if items:
                    if compute:
                        toks = self.execute(items)
                    else:
                        toks = [0] * len(items)
                else:
                    toks = []
                if clock == "virtual":
                    from sim.cost.model import BatchShape

                    if items:
                        vt[0] += cost.step_time_s(BatchShape(list(chunks), dseqs, dkv)) + cost.alloc_time_s(events)
                        # the cost model's after-prefill excess, counted as the simulator's replica does
                        if chunks:
                            after_k[0] = 0
                        elif dseqs and after_k[0] < len(after_s):
                            vt[0] += after_s[after_k[0]]
                            after_k[0] += 1
                te = now() if not cpu_clock else ts + (time.thread_time() - c0) * it_scale
                finished = 0
                for (r, n), tok in zip(items, toks):
                    r.computed += n
                    if r.computed == len(r.tokens):
                        r.tokens.append(int(tok))
                        r.generated += 1
                        if r.first_token < 0:
                            r.first_token = te
                        if r.generated >= r.output:
                            r.status = "completed"
                            r.finish = te
                            finished += 1
                for r in ended:
                    r.finish = te
                    finished += 1
                if finished:
                    keep = []
                    for r in running:
                        if r.status == "completed":
                            self.mem.release(r.id)
                        else:
                            keep.append(r)
                    running[:] = keep
                    done += finished
                c1 = time.thread_time()
                if cpu_clock:
                    vt[0] = ts + (c1 - c0) * it_scale
                    since[0] += c1 - c0
                te2 = now()
                if items or preempted:
                    iters.append(
                        {
                            "start_s": ts,
                            "end_s": te2,
                            "cpu_s": c1 - c0,
                            "prefill_chunks": chunks,
                            "prefill_tokens": ptoks,
                            "decode_seqs": dseqs,
                            "decode_kv_tokens": dkv,
                            "decode_kv_max": dmax,
                            "blocks_in_use": blocks,
                            "reserved_tokens": reserved,
                            "alloc_events": events,
                            "preempted": preempted,
                            "admitted": len(admitted),
                            "running": len(running),
                            "waiting": len(waiting),
                        }
                    )
                    if norm:
                        iters[-1]["speed_scale"] = it_scale
                        iters[-1]["after_probe"] = probed
                        probed = False
                    if clock == "virtual":
                        iters[-1]["end_s"] = te
        if feeder is not None:
            feeder.join(timeout=1.0)
        rows = [
            {
                "id": r.id,
                "status": r.status or "incomplete",
                "arrival_s": r.arrival,
                "enqueued_s": r.enqueued,
                "admitted_s": r.admitted,
                "first_token_s": r.first_token,
                "finish_s": r.finish,
                "prompt_tokens": r.prompt,
                "output_tokens": r.output,
                "generated_tokens": r.generated,
                "preemptions": r.preemptions,
                "output_ids": r.tokens[r.prompt :],
            }
            for r in reqs
        ]
        c = self.cfg
        conf = {
            "model": c.model.name,
            "allocator": c.allocator,
            "num_blocks": c.num_blocks,
            "block_size": c.block_size,
            "reserve": c.reserve,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "dtype": c.dtype,
            "threads": torch.get_num_threads(),
            "device": c.device,
            "clock": clock,
            "kernels": self.attention.name,
        }
        info: dict[str, Any] = {"wall_s": time.perf_counter() - wall0}
        if norm:
            assert probe is not None and probe_ref_s is not None
            conf.update(
                probe_ref_s=float(probe_ref_s),
                probe_every_s=float(probe_every_s),
                probe_window=window,
                probe_shape=probe.shape,
            )
            if dual:
                assert prefill_probe is not None and prefill_probe_ref_s is not None
                conf.update(prefill_probe_ref_s=float(prefill_probe_ref_s), prefill_probe_shape=prefill_probe.shape)
            info["speed_probes"] = probes
        return EngineResult(rows, iters, conf, info)
