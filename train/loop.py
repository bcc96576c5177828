"""The training loop shared by pretraining stages and finetuning.

One optimiser step = ``accum_steps`` micro-batches (DDP syncs gradients on the last only), bf16
autocast on CUDA, gradient clipping, a warmup/decay schedule, JSON-lines + TensorBoard logs with
samples/s, tokens/s, the share of time spent waiting for data and (CUDA) MFU, and atomic
checkpoints from which a resumed run continues exactly.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from lait.config import ConfigError
from lait.log import progress
from lait.train.batch import Batch
from lait.train.checkpoint import (
    Position,
    find_latest,
    load_checkpoint,
    load_weights,
    make_payload,
    prune,
    remove_orphans,
    rng_state,
    save_checkpoint,
    set_rng_state,
    write_latest,
)
from lait.train.config import TrainStageConfig
from lait.train.model import ImageBert, flops_per_token
from lait.train.runtime import MetricLogger, Runtime, make_optimizer, make_scheduler

log = logging.getLogger(__name__)


@dataclass
class StagePlan:
    """A stage as the loop runs it: its config, length, and how to open its data stream."""

    index: int
    config: TrainStageConfig
    steps: int
    open_stream: Callable[[int], Iterator[Batch]]  # batches already consumed -> stream
    prepare: Callable[[Batch], Batch] = lambda b: b  # on-device work before the forward (regions)


class Trainer:
    """Runs a list of stages over one model, checkpointing into ``out_dir/checkpoints``."""

    def __init__(self, task: torch.nn.Module, model: ImageBert, rt: Runtime, out_dir: Path, run_config: dict, *,
                 log_every: int = 10, checkpoint_every: int = 500, keep_checkpoints: int = 2,
                 tensorboard: bool = True, peak_flops: float | None = None, num_workers: int = 0,
                 show_progress: bool = True, compile_model: bool = False):
        self.model, self.rt, self.out_dir = model, rt, Path(out_dir)
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.run_config = run_config
        self.log_every, self.checkpoint_every, self.keep = log_every, checkpoint_every, keep_checkpoints
        self.peak = rt.peak_flops(peak_flops)
        self.num_workers = num_workers
        self.show_progress = show_progress and rt.is_main
        self.base_task = task  # the task itself, also when DDP wraps it below
        task.to(rt.device)
        if compile_model:
            # The encoder only, for any batch size and length (one compile, dynamic shapes); the
            # losses select rows by position and stay eager. In place, so the state dict's names
            # do not change.
            model.compile(dynamic=True)
        if rt.distributed:
            # Some heads sit idle in some runs (MOC without labels, the embedding head while
            # pretraining), so DDP must look for unused parameters.
            task = torch.nn.parallel.DistributedDataParallel(
                task, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None, find_unused_parameters=True
            )
        self.task = task
        self.logger = MetricLogger(self.out_dir, rt.is_main, tensorboard)
        self.history: list[dict] = []  # every logged record, for callers and tests

    @classmethod
    def for_run(cls, task: torch.nn.Module, model: ImageBert, rt: Runtime, cfg: Any) -> Trainer:
        """The trainer of a pretraining or finetuning run, set up from its config (the output
        folder, logging, checkpointing and data-loader settings both share)."""
        return cls(task, model, rt, Path(cfg.output_dir), cfg.to_dict(), log_every=cfg.log_every,
                   checkpoint_every=cfg.checkpoint_every, keep_checkpoints=cfg.keep_checkpoints,
                   tensorboard=cfg.tensorboard, peak_flops=cfg.peak_flops, num_workers=cfg.data.num_workers,
                   show_progress=cfg.progress,
                   compile_model=cfg.compile == "on" or (cfg.compile == "auto" and rt.device.type == "cuda"))

    # ---- checkpoints ---------------------------------------------------------------------------
    def _all_rng(self) -> list:
        mine = rng_state()
        if not self.rt.distributed:
            return [mine]
        out: list = [None] * self.rt.world_size
        torch.distributed.all_gather_object(out, mine)
        return out

    def save(self, pos: Position, opt, sched, name: str | None = None) -> Path | None:
        rngs = self._all_rng()  # collective: every rank takes part
        path = None
        if self.rt.is_main:
            path = self.ckpt_dir / (name or f"step-{pos.global_step:08d}.pt")
            state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
            save_checkpoint(path, make_payload(state, opt, sched, pos, rngs, self.run_config, asdict(self.model.config)))
            write_latest(self.ckpt_dir, path)
            prune(self.ckpt_dir, self.keep)
            log.info("checkpoint/saved %s", path)
        if self.rt.distributed:
            torch.distributed.barrier()
        return path

    def resume_point(self, resume: str | None) -> dict | None:
        if not resume:
            return None
        path = find_latest(self.ckpt_dir) if resume == "auto" else Path(resume)
        if path is None:
            log.info("checkpoint/none_found starting fresh in %s", self.ckpt_dir)
            return None
        ck = load_checkpoint(path)
        try:
            pos = Position(**ck["position"])
        except (KeyError, TypeError):
            raise ConfigError(f"resume: {path} holds no training position (a model-only checkpoint?); "
                              "start a new run with init_from instead") from None
        if pos.num_workers != self.num_workers or pos.world_size != self.rt.world_size:
            raise ConfigError(
                f"{path} was written with {pos.world_size} process(es) x {pos.num_workers} data worker(s); "
                f"resume with the same numbers (the data order depends on them)"
            )
        load_weights(self.model, ck["model"], path)
        log.info("checkpoint/resumed %s at stage %d step %d", path, pos.stage, pos.step)
        return ck

    # ---- stages ----------------------------------------------------------------------------------
    def run(self, stages: list[StagePlan], resume: str | None = None) -> list[dict]:
        if self.rt.is_main:  # the only writer of checkpoints clears what a killed one left
            remove_orphans(self.ckpt_dir)
        ck = self.resume_point(resume)
        pos = Position(**ck["position"]) if ck else Position(num_workers=self.num_workers, world_size=self.rt.world_size)
        for plan in stages:
            if plan.index < pos.stage or (plan.index == pos.stage and ck and pos.step >= plan.steps):
                continue  # finished before the interruption
            if plan.index > pos.stage:
                pos = Position(plan.index, 0, pos.global_step, 0, self.num_workers, self.rt.world_size)
                ck = None
            pos = self.run_stage(plan, pos, ck)
            self.save(pos, None, None, name=f"stage-{plan.index}-{plan.config.name}.pt")
            ck = None
        self.logger.close()
        return self.history

    def run_stage(self, plan: StagePlan, pos: Position, ck: dict | None) -> Position:
        """Train one stage from ``pos`` (restoring ``ck``'s optimiser state and RNG when given).

        A step's losses are read back from the device while the next step runs (one step late),
        so that the host never waits for the device inside the loop; before a checkpoint and at
        the stage's end the last step is read at once."""
        opt, sched, stream = self._start_stage(plan, pos, ck)
        params = [p for p in self.task.parameters() if p.requires_grad]
        self.task.train()
        bar = progress(total=plan.steps, initial=pos.step, desc=plan.config.name, unit="step",
                       disable=not self.show_progress)
        window = _Window()
        unread: tuple | None = None
        while pos.step < plan.steps:
            t0 = time.perf_counter()
            sums = self._accumulate(plan, stream, pos, window)
            grad_norm = self._optimizer_step(params, plan.config.optim.grad_clip, opt, sched)
            pos.step += 1
            pos.global_step += 1
            window.time += time.perf_counter() - t0
            window.steps += 1
            bar.update(1)
            if unread is not None:
                window = self._record(plan, *unread, window, bar)
            unread = (Position(**asdict(pos)), sums, grad_norm, sched.get_last_lr()[0])
            if self.checkpoint_every and pos.step % self.checkpoint_every == 0 and pos.step < plan.steps:
                window = self._record(plan, *unread, window, bar)
                unread = None
                self.save(pos, opt, sched)
        if unread is not None:
            self._record(plan, *unread, window, bar)
        bar.close()
        return pos

    def _start_stage(self, plan: StagePlan, pos: Position, ck: dict | None):
        """The stage's optimiser, schedule and data stream, restored to ``ck`` when resuming."""
        if hasattr(self.base_task, "start_stage"):  # e.g. the stage's own task weights
            self.base_task.start_stage(plan.config)
        opt = make_optimizer(self.task, plan.config.optim, self.rt.device)
        sched = make_scheduler(opt, plan.config.optim, plan.steps)
        # Open the stream first: a DataLoader draws its workers' base seed from the global RNG,
        # which must happen before the checkpointed RNG state is restored, as in the original run.
        stream = iter(plan.open_stream(pos.batches))
        if ck is not None and ck.get("optimizer") is not None:
            opt.load_state_dict(ck["optimizer"])
            sched.load_state_dict(ck["scheduler"])
            set_rng_state(ck["rng"][self.rt.rank])
        return opt, sched, stream

    def _accumulate(self, plan: StagePlan, stream: Iterator[Batch], pos: Position, window: "_Window") -> dict[str, Any]:
        """Forward and backward over one optimiser step's micro-batches; their mean losses and
        report values, as device tensors or floats (DDP syncs gradients on the last micro-batch only)."""
        accum = max(1, plan.config.optim.accum_steps)
        sums: dict[str, Any] = {}
        for micro in range(accum):
            t_wait = time.perf_counter()
            batch = next(stream)
            window.wait += time.perf_counter() - t_wait
            pos.batches += 1
            window.count(batch)  # on the host copy: counting on the device would wait for it
            batch = plan.prepare(batch.to(self.rt.device))
            sync = micro == accum - 1 or not self.rt.distributed
            with contextlib.nullcontext() if sync else self.task.no_sync():
                with self.rt.autocast():
                    loss, losses, report = self.task(batch)
                (loss / accum).backward()
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + v.detach() / accum
            for k, v in report.items():
                sums[k] = sums.get(k, 0.0) + v / accum
            sums["loss"] = sums.get("loss", 0.0) + loss.detach() / accum
        return sums

    @staticmethod
    def _optimizer_step(params: list[torch.Tensor], grad_clip: float, opt, sched) -> torch.Tensor | None:
        """Clip (when set), step the optimiser and the schedule; the gradient norm before clipping."""
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip) if grad_clip else None
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return grad_norm

    def _record(self, plan: StagePlan, pos: Position, sums: dict[str, Any], grad_norm: torch.Tensor | None,
                lr: float, window: "_Window", bar: Any) -> "_Window":
        """Keep the step's record (its values read from the device now); on a log step, write the
        window's means and rates and start a new window (returned)."""
        values = {k: float(v) for k, v in sums.items()}
        if not math.isfinite(values["loss"]):
            raise FloatingPointError(f"non-finite loss at stage {plan.config.name} step {pos.step}: {values}")
        record = {"stage": plan.index, "stage_name": plan.config.name, "step": pos.step, "global_step": pos.global_step,
                  "lr": lr, **values}
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        self.history.append(record)
        window.add(record)
        if pos.step % self.log_every == 0 or pos.step == plan.steps:
            # The log line averages the window's steps: single-step losses are too noisy.
            self.logger.log({**record, **window.means(), **window.rates(self.rt.world_size, self.model.config, self.peak)})
            bar.set_postfix(loss=f"{sums['loss']:.3f}")
            window = _Window()
        return window


@dataclass
class _Window:
    """Throughput counters between two log lines."""

    time: float = 0.0
    wait: float = 0.0
    samples: int = 0
    tokens: int = 0
    steps: int = 0
    seq: int = 0
    totals: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)

    _KEEP = ("stage", "stage_name", "step", "global_step", "lr")

    def count(self, batch: Batch) -> None:
        """Count one micro-batch's samples and tokens (``seq``: its padded sequence length)."""
        self.samples += batch.size
        self.tokens += batch.num_tokens
        self.seq = batch.input_ids.shape[1] + (0 if batch.region_valid is None else batch.region_valid.shape[1])

    def add(self, record: dict) -> None:
        for k, v in record.items():
            if k not in self._KEEP and isinstance(v, float) and math.isfinite(v):
                self.totals[k] = self.totals.get(k, 0.0) + v
                self.counts[k] = self.counts.get(k, 0) + 1

    def means(self) -> dict:
        return {k: v / self.counts[k] for k, v in self.totals.items()}

    def rates(self, world: int, cfg, peak: float | None) -> dict:
        t = max(self.time, 1e-9)
        out = {
            "samples_per_s": self.samples * world / t,
            "tokens_per_s": self.tokens * world / t,
            "data_wait_share": self.wait / t,
        }
        if peak:
            out["mfu"] = self.tokens * flops_per_token(cfg, self.seq) / t / peak
        return out
