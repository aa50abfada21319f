"""vLLM's real V1 scheduler on CPU, driven the way vLLM's own scheduler tests
drive it: schedule() -> a synthetic ModelRunnerOutput -> update_from_output().
The worker half of PlannerSwapConnector runs for real on CPU tensors
registered as the KV caches; the "forward pass" writes a known value into the
KV slot of every scheduled token and first checks that every earlier token's
KV still holds its value, which is what attention would read. The forward
runs layer by layer between the connector's wait_for_layer_load and
save_kv_layer, as vLLM's attention layers call them; with layer offload on,
the GPU copy of every layer the connector evicted is poisoned right after
its save, so a request whose offloaded layer was not fetched back fails the
check."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from planner.adapters.vllm.connector import PlannerSwapConnector
from planner.adapters.vllm.scheduler import PlannerScheduler
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 12
NUM_CPU_BLOCKS = 64
TOKEN_ID = 7
STEP_S = 0.05
LAYERS = ("layers.0", "layers.1")
POISON = -7.0
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 1024,
    "torch_dtype": "float32",
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@pytest.fixture(scope="session")
def vllm_config(tmp_path_factory: pytest.TempPathFactory) -> VllmConfig:
    os.environ["HF_HUB_OFFLINE"] = "1"
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA), encoding="utf-8")
    return VllmConfig(
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=256,
            max_model_len=512,
            enable_chunked_prefill=True,
            async_scheduling=True,
            is_encoder_decoder=False,
            scheduler_cls="planner.adapters.vllm.scheduler.PlannerScheduler",
        ),
        model_config=ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=512
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False),
        kv_transfer_config=KVTransferConfig(
            kv_connector="PlannerSwapConnector",
            kv_connector_module_path="planner.adapters.vllm.connector",
            kv_role="kv_both",
            kv_connector_extra_config={"num_cpu_blocks": NUM_CPU_BLOCKS},
        ),
    )


def kv_cache_config(layers: tuple[str, ...] = LAYERS) -> KVCacheConfig:
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=2, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(layers), spec)],
    )


@pytest.fixture(name="kv_cache_config")
def kv_cache_config_fixture() -> KVCacheConfig:
    return kv_cache_config()


def make_scheduler(
    vllm_config: VllmConfig, planner: dict[str, Any], layers: tuple[str, ...] = LAYERS
) -> PlannerScheduler:
    vllm_config.additional_config = {"planner": planner}
    vllm_config.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
    return PlannerScheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config(layers),
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        log_stats=True,
    )


def kv_value(request_index: int, position: int) -> torch.Tensor:
    """The KV one token leaves in one layer: (K|V, head, dim), exact in fp32."""
    base = float(request_index * 10_000 + position * 4)
    return torch.tensor([[[base, base + 1]], [[base + 2, base + 3]]])


@dataclass
class EngineRun:
    """One engine: the scheduler, the worker half of the connector, the KV
    caches it copies (two layouts: (2, blocks, ...) and (blocks, 2, ...)),
    and what the engine has returned so far."""

    scheduler: PlannerScheduler
    # None: the engine runs without the connector.
    worker: PlannerSwapConnector | None
    kv: dict[str, torch.Tensor]
    layers: tuple[str, ...] = LAYERS
    index: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    kv_checked_tokens: int = 0
    # (time, request id, tokens, finished) of every output the engine returned.
    deliveries: list[tuple[float, str, int, bool]] = field(default_factory=list)
    # Per step, the per-layer timings the worker sent to the scheduler.
    worker_timings: list[Any] = field(default_factory=list)
    # The connector stats each step's SchedulerStats carried to the front end.
    connector_stats: list[dict[str, Any]] = field(default_factory=list)
    now_s: float = 0.0
    last_output: SchedulerOutput | None = None

    def add(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        self.index[request_id] = len(self.index)
        self.scheduler.add_request(
            Request(
                request_id=request_id,
                prompt_token_ids=[TOKEN_ID] * prompt_tokens,
                sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                pooling_params=None,
                arrival_time=self.now_s,
            )
        )

    def _slot(self, layer: str, block: int, offset: int) -> torch.Tensor:
        cache = self.kv[layer]
        if cache.shape[0] == 2:
            return cache[:, block, offset]
        return cache[block, :, offset]

    def step(self) -> None:
        self.now_s += STEP_S
        out = self.scheduler.schedule()
        self.last_output = out
        meta = out.kv_connector_metadata
        assert (meta is None) == (self.worker is None)
        if self.worker is not None:
            self.worker.handle_preemptions(meta)
        # Whatever vLLM reuses a freed block for overwrites it: scribble on
        # every block no running request holds, so a resumed request's KV is
        # right only if the connector brought it back.
        held: set[int] = set()
        for request in self.scheduler.running:
            held.update(self.scheduler.kv_cache_manager.get_block_ids(request.request_id)[0])
        for name in self.layers:
            for block in set(range(NUM_GPU_BLOCKS)) - held:
                self._slot(name, block, slice(None)).fill_(-1.0)
        if self.worker is not None:
            self.worker.bind_connector_metadata(meta)
            self.worker.start_load_kv(None)  # type: ignore[arg-type]
        sampled: list[list[int]] = []
        batch: list[tuple[str, list[int], int, int]] = []
        for rid, n in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[rid]
            (blocks, *_) = self.scheduler.kv_cache_manager.get_block_ids(rid)
            batch.append((rid, blocks, request.num_computed_tokens - n, n))
            sampled.append([TOKEN_ID] if request.num_computed_tokens >= request.num_tokens else [])
        for index, layer in enumerate(self.layers):
            if self.worker is not None:
                self.worker.wait_for_layer_load(layer)
            for rid, blocks, start, n in batch:
                self._forward(layer, rid, blocks, start, n)
            if self.worker is not None:
                self.worker.save_kv_layer(layer, self.kv[layer], None)  # type: ignore[arg-type]
                for block in meta.layers.evicted.get(index, ()):
                    self._slot(layer, block, slice(None)).fill_(POISON)
        connector_output = None
        if self.worker is not None:
            self.worker.wait_for_save()
            timings = self.worker.build_connector_worker_meta()
            if timings is not None:
                self.worker_timings.append(timings)
            connector_output = KVConnectorOutput(kv_connector_worker_meta=timings)
            self.worker.clear_connector_metadata()
        self.preempted.extend(out.preempted_req_ids or ())
        ids = list(out.num_scheduled_tokens)
        result = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=connector_output,
        )
        for outputs in self.scheduler.update_from_output(out, result).values():
            stats = outputs.scheduler_stats
            if stats is not None and stats.kv_connector_stats:
                self.connector_stats.append(stats.kv_connector_stats)
            for o in outputs.outputs:
                self.tokens[o.request_id] = self.tokens.get(o.request_id, 0) + len(o.new_token_ids)
                self.deliveries.append(
                    (self.now_s, o.request_id, len(o.new_token_ids), o.finish_reason is not None)
                )
                if o.finish_reason is not None:
                    self.finished.append(o.request_id)

    def _forward(self, layer: str, rid: str, blocks: list[int], start: int, n: int) -> None:
        i = self.index[rid]
        for pos in range(start):
            got = self._slot(layer, blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE)
            assert torch.equal(got, kv_value(i, pos)), (rid, layer, pos)
        for pos in range(start, start + n):
            self._slot(layer, blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE).copy_(kv_value(i, pos))
        self.kv_checked_tokens += start

    def run(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_requests():
                return
            self.step()
        raise AssertionError(f"requests left after {max_steps} steps")


@pytest.fixture
def engine(vllm_config: VllmConfig) -> Iterator[Any]:
    """engine(planner_settings) -> EngineRun; shut down at teardown."""
    runs: list[EngineRun] = []

    def start(
        planner: dict[str, Any], *, swap: bool = True, layers: tuple[str, ...] = LAYERS
    ) -> EngineRun:
        config = vllm_config if swap else _without_connector(vllm_config)
        scheduler = make_scheduler(config, planner, layers)
        # An in-process planner loads its handler on its own thread; steps
        # before it is loaded fall back. Tests that count answers start after.
        links = [scheduler.planner_link]
        if scheduler.layer_planner is not None:
            links.append(scheduler.layer_planner.link)
        for link in links:
            assert link.wait_idle(60.0), "the in-process planner did not load"
        worker = worker_connector(config, layers) if swap else None
        run = EngineRun(scheduler, worker, {}, layers)
        scheduler.now = lambda: run.now_s
        # Both vLLM layouts, alternating: (2, blocks, ...) and (blocks, 2, ...).
        run.kv = {
            name: torch.zeros(2, NUM_GPU_BLOCKS, BLOCK_SIZE, 1, 2)
            if i % 2 == 0
            else torch.zeros(NUM_GPU_BLOCKS, 2, BLOCK_SIZE, 1, 2)
            for i, name in enumerate(layers)
        }
        if run.worker is not None:
            run.worker.register_kv_caches(run.kv)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.scheduler.shutdown()


def _without_connector(vllm_config: VllmConfig) -> VllmConfig:
    config = copy.deepcopy(vllm_config)
    config.kv_transfer_config = None
    return config


def worker_connector(
    vllm_config: VllmConfig, layers: tuple[str, ...] = LAYERS
) -> PlannerSwapConnector:
    return PlannerSwapConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config(layers))
