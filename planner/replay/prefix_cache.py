"""Automatic prefix caching of the GPU KV pool, as vLLM models it: a full
block of prompt KV is known by the chain of its prefix (the trace's
`prefix_block_ids`, Mooncake's hash_ids, one per `prefix_block_tokens`
tokens), so two requests whose prompts begin alike share those blocks.

- Identity: engine block j of a request (tokens [j*B, (j+1)*B), B the block
  size) is cacheable when those tokens lie inside both its prompt and the
  span its prefix ids cover; it is known by the chain of prefix ids up to the
  one covering its last token, and by where it ends. Only full blocks are
  cached; output tokens never are (the trace names no content for them).
- Sharing: a cached block is held once in the pool whatever the number of
  requests referencing it (its reference count). A request's other blocks
  are its own (private): its gpu_blocks column counts both, the pool only
  once.
- Hits: a request that starts looks its blocks up in order and stops at the
  first miss; hits are referenced, their tokens are not prefilled. At most
  the prompt less one token hits, so the prefill still emits the first token
  (vLLM's rule). Blocks become cached as the prefill computes them.
- Freeing: released blocks go to the tail of one least-recently-freed queue,
  the request's last block first (so it is evicted first); cached ones stay
  cached there with a reference count of 0 and count as free. A new block is
  taken from blocks never used first, then from the head of that queue,
  evicting the cached block there (vLLM's free block queue).
- Swapping and recompute: a request that is preempted, by swap or by
  recompute, releases its references like a finished one, so a block shared
  with running requests stays on the GPU and counts once. Its swap copies
  its whole KV to CPU as before (a shared block may be evicted before it
  resumes). Resuming from CPU re-references its blocks still cached on the
  GPU and copies in only the others, which become cached again; a request
  preempted by recompute starts again as a new one, with hits on what is
  still cached.

The engine keeps the free count (EngineState.free_gpu) and takes blocks
from it directly (a decode that grows, a prefill's private blocks): those
anonymous takes come from the head of the queue, and the cache catches up
with them (`_catch_up`) before anything that reads or changes the queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from planner.replay.state import IntArray

# A cached block's key: its prefix chain's id shifted left, plus where it
# ends (in tokens, below 2**_END_BITS).
_END_BITS = 26


class PrefixCacheError(ValueError):
    pass


class PrefixCache:
    """The cached blocks of one GPU pool and the references requests hold.

    prefix_ids[row]: request row's prefix block ids; prompt_tokens[row]: its
    prompt length. gpu_blocks: the pool; block_size: tokens per block;
    prefix_block_tokens: tokens per prefix id."""

    def __init__(
        self,
        prefix_ids: Sequence[Sequence[int]],
        prompt_tokens: IntArray,
        gpu_blocks: int,
        block_size: int,
        prefix_block_tokens: int,
    ) -> None:
        if prefix_block_tokens < 1:
            raise PrefixCacheError(f"prefix_block_tokens must be >= 1, got {prefix_block_tokens}")
        if block_size < 1:
            raise PrefixCacheError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.prefix_block_tokens = prefix_block_tokens
        n = len(prefix_ids)
        # Each request's chain of prefix ids as the ids of its nodes in one
        # tree of all requests' prefixes: request row's are
        # chains[chain_start[row]:chain_start[row + 1]].
        node_of: dict[tuple[int, int], int] = {}
        chains: list[int] = []
        starts = np.zeros(n + 1, dtype=np.int64)
        for row, ids in enumerate(prefix_ids):
            parent = -1
            for block_id in ids:
                parent = node_of.setdefault((parent, int(block_id)), len(node_of))
                chains.append(parent)
            starts[row + 1] = len(chains)
        self._chains = np.array(chains, dtype=np.int64)
        self._chain_start = starts
        covered = np.minimum(np.diff(starts) * prefix_block_tokens, prompt_tokens)
        if len(covered) and int(covered.max()) >= 1 << _END_BITS:
            raise PrefixCacheError(
                f"prefix caching covers prompts below {1 << _END_BITS} tokens, got "
                f"{int(prompt_tokens.max())}"
            )
        # Full blocks of each request that can be cached.
        self.cacheable_blocks: IntArray = covered // block_size
        # Key -> references held by requests; 0: cached and free (queued).
        self.refs: dict[int, int] = {}
        # Free blocks that were used: key >= 0 a cached block (value 1), key
        # < 0 a run of `value` private blocks; least recently freed first.
        self.queue: OrderedDict[int, int] = OrderedDict()
        self._next_run = -1
        self.never_used = gpu_blocks
        # The free count the queue and never_used stand for.
        self._free = gpu_blocks
        self.held: list[list[int]] = [[] for _ in range(n)]
        # Cacheable blocks of each request already looked at while it runs.
        self.scanned = np.zeros(n, dtype=np.int64)
        # Hit tokens at each request's first start (-1: not started yet).
        self.first_hit_tokens = np.full(n, -1, dtype=np.int64)
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.evictions = 0
        self.reused_on_resume = 0
        # The keys of each started request's cacheable blocks, until it
        # finishes.
        self._keys: dict[int, list[int]] = {}

    # -- keys ---------------------------------------------------------------

    def key(self, row: int, block: int) -> int:
        end = (block + 1) * self.block_size
        node = self._chains[self._chain_start[row] + (end - 1) // self.prefix_block_tokens]
        return (int(node) << _END_BITS) | end

    def keys(self, row: int) -> list[int]:
        """The keys of row's cacheable blocks, in order."""
        found = self._keys.get(row)
        if found is None:
            ends = np.arange(1, int(self.cacheable_blocks[row]) + 1, dtype=np.int64)
            ends *= self.block_size
            chain = self._chains[self._chain_start[row] : self._chain_start[row + 1]]
            found = ((chain[(ends - 1) // self.prefix_block_tokens] << _END_BITS) | ends).tolist()
            self._keys[row] = found
        return found

    # -- keeping up with the engine's free count ----------------------------

    def _catch_up(self, free_gpu: int) -> None:
        """The engine took `self._free - free_gpu` blocks since the cache
        last looked: they came from never-used blocks, then from the head of
        the queue (evicting cached blocks there)."""
        taken = self._free - free_gpu
        if taken < 0:
            raise PrefixCacheError(
                f"the engine freed {-taken} blocks without releasing them to the cache"
            )
        fresh = min(taken, self.never_used)
        self.never_used -= fresh
        taken -= fresh
        queue = self.queue
        while taken:
            entry, size = queue.popitem(last=False)
            if entry >= 0:
                del self.refs[entry]
                self.evictions += 1
                taken -= 1
            elif size > taken:
                queue[entry] = size - taken
                queue.move_to_end(entry, last=False)
                taken = 0
            else:
                taken -= size
        self._free = free_gpu

    # -- lookups --------------------------------------------------------------

    def _hit_limit(self, row: int, target_tokens: int) -> int:
        return min(int(self.cacheable_blocks[row]), max(target_tokens - 1, 0) // self.block_size)

    def start_cost(self, row: int, need: int, target_tokens: int, free_gpu: int) -> tuple[int, int]:
        """For a queued row that would start with `need` blocks and prefill
        to target_tokens: (blocks it would take from the free count, its hit
        tokens). Changes nothing but evictions the engine already caused."""
        limit = self._hit_limit(row, target_tokens)
        if not limit:
            return need, 0
        self._catch_up(free_gpu)
        refs = self.refs
        hits = shared = 0
        for key in self.keys(row)[:limit]:
            count = refs.get(key)
            if count is None:
                break
            hits += 1
            shared += count > 0
        return need - shared, hits * self.block_size

    def resume_cost(self, row: int, need: int, kv_tokens: int, free_gpu: int) -> int:
        """For a rotary row resuming into `need` blocks: blocks it would take
        from the free count (its blocks cached and held by others cost
        nothing)."""
        last = min(int(self.cacheable_blocks[row]), kv_tokens // self.block_size)
        if not last:
            return need
        self._catch_up(free_gpu)
        refs = self.refs
        shared = 0
        for key in self.keys(row)[:last]:
            shared += refs.get(key, 0) > 0
        return need - shared

    # -- moves ----------------------------------------------------------------

    def _reference(self, key: int) -> bool:
        """One more reference to a cached block; True when it was free."""
        count = self.refs[key]
        self.refs[key] = count + 1
        if count == 0:
            del self.queue[key]
            self._free -= 1
            return True
        return False

    def start(
        self, row: int, prompt_tokens: int, target_tokens: int, free_gpu: int
    ) -> tuple[int, int]:
        """Row starts from its queue: it references its hits. Returns (hit
        blocks, of which held by others before); the engine takes the rest of
        its blocks from the free count (see start_cost)."""
        self._catch_up(free_gpu)
        limit = self._hit_limit(row, target_tokens)
        refs = self.refs
        held = self.held[row]
        hits = shared = 0
        for key in self.keys(row)[:limit]:
            if key not in refs:
                break
            shared += not self._reference(key)
            held.append(key)
            hits += 1
        self.scanned[row] = hits
        if self.first_hit_tokens[row] < 0:
            self.first_hit_tokens[row] = hits * self.block_size
            self.hit_tokens += hits * self.block_size
            self.queried_tokens += prompt_tokens
        return hits, shared

    def computed(self, row: int, kv_tokens: int) -> None:
        """Row's KV now holds kv_tokens: its newly full cacheable blocks
        become cached (a block already cached from another request stays
        private: the pool holds both, as vLLM's does)."""
        upto = min(int(self.cacheable_blocks[row]), kv_tokens // self.block_size)
        first = int(self.scanned[row])
        if upto <= first:
            return
        refs = self.refs
        held = self.held[row]
        for key in self.keys(row)[first:upto]:
            if key not in refs:
                refs[key] = 1
                held.append(key)
        self.scanned[row] = upto

    def resume(self, row: int, kv_tokens: int, free_gpu: int) -> tuple[int, int]:
        """Rotary row resumes: its cacheable blocks still cached are
        referenced again (no copy), the others will be copied in and become
        cached. Returns (blocks reused, of which held by others before)."""
        self._catch_up(free_gpu)
        last = min(int(self.cacheable_blocks[row]), kv_tokens // self.block_size)
        refs = self.refs
        held = self.held[row]
        reused = shared = 0
        for key in self.keys(row)[:last]:
            if key in refs:
                reused += 1
                shared += not self._reference(key)
            else:
                refs[key] = 1
            held.append(key)
        self.scanned[row] = last
        self.reused_on_resume += reused
        return reused, shared

    def release(self, row: int, gpu_blocks: int, free_gpu: int, finished: bool = False) -> int:
        """Row gives up its gpu_blocks (finished or preempted): its private
        blocks and the cached ones nobody else holds go to the queue's tail,
        its last block first. Returns the blocks that became free."""
        self._catch_up(free_gpu)
        held = self.held[row]
        private = gpu_blocks - len(held)
        if private < 0:
            raise PrefixCacheError(f"row {row} holds {gpu_blocks} blocks, {len(held)} cached")
        freed = private
        if private:
            self.queue[self._next_run] = private
            self._next_run -= 1
        refs = self.refs
        queue = self.queue
        for key in reversed(held):
            count = refs[key] - 1
            refs[key] = count
            if count == 0:
                queue[key] = 1
                freed += 1
        held.clear()
        self.scanned[row] = 0
        self._free += freed
        if finished:
            self._keys.pop(row, None)
        return freed

    # -- reading --------------------------------------------------------------

    def cached_free(self) -> int:
        """Cached blocks nobody holds (free, evicted when needed)."""
        return sum(1 for count in self.refs.values() if count == 0)

    def shared_blocks(self, row: int) -> int:
        """Blocks row holds that another request holds too."""
        refs = self.refs
        return sum(1 for key in self.held[row] if refs[key] > 1)

    def held_blocks(self) -> int:
        """Cached blocks some request holds (each counted once)."""
        return sum(1 for count in self.refs.values() if count > 0)
