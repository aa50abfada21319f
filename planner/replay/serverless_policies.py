"""The serverless topology's policies by name: where each keeps the weights,
how it places models on slices, how it chunks prefills and sets rho, and
what a model switch costs it.

- ``c2cserve``: on a slice whose HBM holds a model's weights next to its
  KV reserve, each model keeps as much of its weights as fits next to the
  KV the slice keeps (all of them alone; an equal part each when models
  share the slice: ``resident_split``), copied over C2C when it is placed
  and topped up later; the rest streams from host memory over C2C on every
  pass (on smaller slices, every weight streams); the queue-aware
  scheduler (``schedule_waiting``): a model's requests go where it is
  resident; else to an idle slice within the link budget; else it takes the
  place of an inactive model; else it shares a busy slice (up to
  ``max_models_per_slice`` models take turns iteration by iteration, within
  the link budget); else it takes the place of a lower-priority model, or,
  urgent, of one with enough slack, or, starving, of any that has held its
  place for Q (the preempted requests' KV moves to host memory); idle
  slices prewarmed by ``plan_placement``; ``choose_chunk``; one
  ``RhoTuner`` per resident model; a switch costs engine set-up (the
  paper's 50 ms). A model with every weight resident runs as dedicated
  runs its own (``resident_like_hbm``). When the KV of the requests in
  flight, or of one it would admit, needs HBM its resident weights hold, it
  drops weights (they stream instead) only if the decode batch that room
  lets run makes more tokens per second (the slice's residents taking
  turns) than the batch without it; else the request waits or the youngest
  running one swaps out (``kv_takes_weights``). Shares end
  (``end_share``): a resident with nothing in flight leaves a slice another
  resident is busy on (which copies its weights back in), and of two busy
  residents one moves to a free slice, or back to wait within its
  requests' slack, when the work in flight finishes sooner that way than
  with both streaming part of their weights and taking turns.
- ``c2cserve-sticky-share``: c2cserve whose shares last until a resident is
  evicted (an idle resident keeps its part of the slice's HBM; two busy
  residents share for good).
- ``c2cserve-kv-first``: c2cserve dropping resident weights whenever the
  KV needs their room.
- ``c2cserve-kv-cap``: c2cserve dropping resident weights only for the KV
  of a request alone on its slice: with others in flight the KV is capped
  at what fits next to the weights, as on the HBM baselines' slices.
- ``c2cserve-light-share``: c2cserve sharing only light slices: a model
  joins a slice only if its residents' requests in flight and its own are
  at most ``share_max_in_flight``, and a shared slice busier than that
  sheds the resident with the fewest (it finishes what it has started and
  leaves, its HBM going to the others), so that under saturation each slice
  runs one model with all its weights resident, as dedicated does.
- ``c2cserve-chunked``: c2cserve running a model whose weights are all
  resident as if they streamed: ``choose_chunk``'s smallest chunk meeting
  TTFT on the link's fair share, the tuner's rho, and the resident weights'
  HBM reads added to the pass's other HBM traffic (c2cserve runs such a
  model as dedicated runs its own: the static chunk, rho 0, the weight
  reads a roofline term of their own).
- ``c2cserve-partial``: c2cserve keeping a part resident on slices too
  small for the whole model as well.
- ``c2cserve-stream``: c2cserve streaming every weight on every pass,
  nothing resident (the paper's design). The paper's ablations (§9.4)
  below are variants of it, streaming every weight:
- ``c2cserve-exclusive``: c2cserve-stream with one model per slice (no
  sharing).
- ``c2cserve-inactive``: one model per slice and it evicts inactive models
  only (no preemption, no sharing): the routing before the queue-aware
  scheduler.
- ``random``: c2cserve-stream's streaming, preemption, chunk and tuner, one model
  per slice, but a waiting model goes to a slice drawn (seeded) among the
  idle and evictable ones, ignoring the link budget (the paper's §9.4.2
  ablation).
- ``static-chunk``: c2cserve-stream with every chunk the engine's token budget.
- ``static-rho``: c2cserve-stream with rho fixed at the cost model's best static
  rho on an uncontended link, no tuner.
- ``dedicated``: weights loaded into the slice's HBM on a switch over the
  load link (PCIe unless ``--load-link c2c``), no engine work; evicts
  inactive models only; weights read from HBM.
- ``sllm`` (ServerlessLLM) and ``aegaeon`` (Aegaeon): as dedicated, loading
  over C2C (GH200 has no PCIe host link), plus each system's engine work on
  a switch calibrated to the paper's warm-switch latency
  (planner.profiles.switch_costs); ``aegaeon`` preempts like c2cserve (its
  token-granularity scheduling), ``sllm`` evicts inactive models only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.profiles.switch_costs import DENSE_SWITCH_PROFILES, SwitchProfile
from planner.registry import Registry, registry_of

SCHEDULER = "scheduler"
RANDOM_PLACEMENT = "random"
CHOOSE_CHUNK = "choose"
STATIC = "static"
TUNER = "tuner"
BEST_STATIC = "best-static"
NO_RHO = "none"
# When a slice's KV needs the HBM its resident weights hold: drop weights
# whenever it does, or only when the decode batch the room lets run makes
# more tokens per second than the batch that runs without it.
KV_TAKES_WEIGHTS = "always"
KV_TAKES_WEIGHTS_WHEN_FASTER = "when-faster"
# ... or only for a request alone on the slice (else it waits, or the
# youngest running request swaps out, as on a slice with every weight in HBM).
KV_TAKES_WEIGHTS_WHEN_ALONE = "when-alone"


@dataclass(frozen=True, slots=True)
class ServerlessPolicy:
    name: str
    # Weights stream from host memory over C2C (else: loaded into HBM).
    streams: bool
    # Preempt active models (lower priority at once; equal priority when
    # urgent or starving) instead of evicting inactive ones only.
    preempts: bool
    # Several models may be resident on one slice (taking turns).
    shares: bool = False
    placement: str = SCHEDULER
    # Set idle slices up ahead of demand every replan interval.
    prewarm: bool = False
    chunk: str = CHOOSE_CHUNK
    rho: str = TUNER
    # Engine work on a switch, from the paper's switch latency (None: none).
    switch_profile: SwitchProfile | None = None
    # The link weights load over when --load-link does not say ("pcie" or
    # "c2c"; streaming policies copy their resident part over C2C).
    default_load_link: str = "c2c"
    # Streaming policies: keep what fits of the weights in the slice's HBM
    # (copied over C2C on placement) and stream the rest.
    keeps_resident: bool = False
    # ... also on slices whose HBM cannot hold all of a model's weights next
    # to its KV reserve (else those stream every weight).
    partial_residency: bool = False
    # Share a slice only while its residents are light (at most the config's
    # share_max_in_flight requests in flight), and when a shared slice gets
    # busier than that, the resident with the least in flight leaves it (no
    # new requests; it goes once those in flight are done): under saturation
    # one model per slice keeps all its weights resident, as dedicated does.
    shares_when_light: bool = False
    # With a disk read on the cold path: the copy into HBM runs alongside the
    # read (ServerlessLLM's multi-tier loader pipelines SSD -> DRAM -> GPU)
    # instead of after it.
    pipelined_load: bool = False
    # A model with every weight resident on its slice runs as the HBM
    # baselines do: prefill in the static chunk (nothing of it streams, so
    # there is no C2C burst for a smaller chunk to smooth, and every extra
    # chunk reads the weights again), rho 0 (no C2C to trade HBM traffic
    # for), and the resident weights' HBM reads timed as the baselines'
    # weight reads (a roofline term of their own, partly resident models too).
    resident_like_hbm: bool = False
    # Policies that keep weights resident: when the KV of requests in flight
    # or admitted may take the HBM of resident weights (KV_TAKES_WEIGHTS*).
    kv_takes_weights: str = KV_TAKES_WEIGHTS
    # Shares end (``end_share``): a resident with nothing in flight leaves a
    # slice another one is busy on, and of two busy ones one moves to a free
    # slice, or back to wait for a bounded time, when finishing the work in
    # flight that way beats streaming both (else a share lasts until a
    # resident is evicted).
    ends_shares: bool = False

    @property
    def respects_link_budget(self) -> bool:
        return self.streams and self.placement == SCHEDULER


C2CSERVE = "c2cserve"
C2CSERVE_KV_FIRST = "c2cserve-kv-first"
C2CSERVE_KV_CAP = "c2cserve-kv-cap"
C2CSERVE_STICKY_SHARE = "c2cserve-sticky-share"
C2CSERVE_LIGHT_SHARE = "c2cserve-light-share"
C2CSERVE_CHUNKED = "c2cserve-chunked"
C2CSERVE_STREAM = "c2cserve-stream"
C2CSERVE_PARTIAL = "c2cserve-partial"
C2CSERVE_EXCLUSIVE = "c2cserve-exclusive"
C2CSERVE_INACTIVE = "c2cserve-inactive"
DEDICATED = "dedicated"
RANDOM = "random"
STATIC_CHUNK = "static-chunk"
STATIC_RHO = "static-rho"
SLLM = "sllm"
AEGAEON = "aegaeon"

_C2CSERVE = ServerlessPolicy(
    C2CSERVE,
    streams=True,
    preempts=True,
    shares=True,
    prewarm=True,
    keeps_resident=True,
    resident_like_hbm=True,
    kv_takes_weights=KV_TAKES_WEIGHTS_WHEN_FASTER,
    ends_shares=True,
)

SERVERLESS_POLICIES: Registry[ServerlessPolicy] = registry_of(
    "serverless policy",
    lambda p: p.name,
    (
        _C2CSERVE,
        replace(_C2CSERVE, name=C2CSERVE_KV_FIRST, kv_takes_weights=KV_TAKES_WEIGHTS),
        replace(_C2CSERVE, name=C2CSERVE_KV_CAP, kv_takes_weights=KV_TAKES_WEIGHTS_WHEN_ALONE),
        replace(_C2CSERVE, name=C2CSERVE_STICKY_SHARE, ends_shares=False),
        ServerlessPolicy(
            C2CSERVE_LIGHT_SHARE,
            streams=True,
            preempts=True,
            shares=True,
            prewarm=True,
            keeps_resident=True,
            shares_when_light=True,
            resident_like_hbm=True,
        ),
        ServerlessPolicy(
            C2CSERVE_CHUNKED,
            streams=True,
            preempts=True,
            shares=True,
            prewarm=True,
            keeps_resident=True,
        ),
        ServerlessPolicy(C2CSERVE_STREAM, streams=True, preempts=True, shares=True, prewarm=True),
        ServerlessPolicy(
            C2CSERVE_PARTIAL,
            streams=True,
            preempts=True,
            shares=True,
            prewarm=True,
            keeps_resident=True,
            partial_residency=True,
            resident_like_hbm=True,
        ),
        ServerlessPolicy(C2CSERVE_EXCLUSIVE, streams=True, preempts=True, prewarm=True),
        ServerlessPolicy(C2CSERVE_INACTIVE, streams=True, preempts=False, prewarm=True),
        ServerlessPolicy(
            DEDICATED,
            streams=False,
            preempts=False,
            chunk=STATIC,
            rho=NO_RHO,
            default_load_link="pcie",
        ),
        ServerlessPolicy(
            RANDOM,
            streams=True,
            preempts=True,
            placement=RANDOM_PLACEMENT,
        ),
        ServerlessPolicy(
            STATIC_CHUNK,
            streams=True,
            preempts=True,
            shares=True,
            prewarm=True,
            chunk=STATIC,
        ),
        ServerlessPolicy(
            STATIC_RHO,
            streams=True,
            preempts=True,
            shares=True,
            prewarm=True,
            rho=BEST_STATIC,
        ),
        ServerlessPolicy(
            SLLM,
            streams=False,
            preempts=False,
            chunk=STATIC,
            rho=NO_RHO,
            pipelined_load=True,
            switch_profile=DENSE_SWITCH_PROFILES["sllm"],
        ),
        ServerlessPolicy(
            AEGAEON,
            streams=False,
            preempts=True,
            chunk=STATIC,
            rho=NO_RHO,
            switch_profile=DENSE_SWITCH_PROFILES["aegaeon"],
        ),
    ),
    summaries={
        C2CSERVE: "C2CServe: what fits of the weights resident next to the KV on slices that "
        "hold the whole model (all resident: prefilled as dedicated prefills, in one large "
        "chunk), the rest streamed over C2C; KV takes resident weights' HBM only when that "
        "raises the slice's decode tokens/s; queue-aware scheduling; a share of a slice ends "
        "when a resident idles or moving a busy one beats streaming both",
        C2CSERVE_KV_FIRST: "c2cserve dropping resident weights whenever the KV needs their HBM",
        C2CSERVE_KV_CAP: "c2cserve dropping resident weights for the KV of a request alone on "
        "its slice only",
        C2CSERVE_STICKY_SHARE: "c2cserve whose shares last until a resident is evicted: an idle "
        "resident keeps its part of the HBM, two busy ones share for good",
        C2CSERVE_LIGHT_SHARE: "c2cserve sharing a slice only while its requests in flight stay "
        "within --share-max-in-flight, shedding a model from a busier one",
        C2CSERVE_CHUNKED: "c2cserve choosing prefill chunks and rho for resident weights as "
        "for streamed ones, their HBM reads added to the pass's other HBM traffic",
        C2CSERVE_STREAM: "C2CServe as the paper has it: every weight streamed on every pass",
        C2CSERVE_PARTIAL: "c2cserve keeping a part resident on slices too small for the model too",
        C2CSERVE_EXCLUSIVE: "c2cserve-stream with one model per slice (no sharing)",
        C2CSERVE_INACTIVE: "one model per slice, evicting inactive models only",
        RANDOM: "c2cserve-stream placing a waiting model on a random idle or evictable slice",
        STATIC_CHUNK: "c2cserve-stream with every chunk the engine's token budget",
        STATIC_RHO: "c2cserve-stream with rho fixed at the best static value, no tuner",
        DEDICATED: "weights loaded into HBM on a switch (PCIe unless --load-link c2c)",
        SLLM: "ServerlessLLM: loads over C2C plus its switch work; evicts inactive models only",
        AEGAEON: "Aegaeon: loads over C2C plus its switch work; preempts like c2cserve",
    },
    served_by={C2CSERVE: "ServerlessService.ScheduleWaiting"},
)
SERVERLESS_POLICY_NAMES = SERVERLESS_POLICIES.names()
