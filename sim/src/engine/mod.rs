//! A deterministic model of one vLLM V1 replica: FCFS waiting queue, up to `max_num_seqs`
//! running sequences, a per-step token budget with chunked prefill, prefix caching over whole
//! blocks, KV capacity with LRU eviction and recompute preemption, and a step-time model.
//!
//! ## Contract
//! - The engine never reads a clock. A driver calls [`Engine::start_step`] at time `t`, which
//!   schedules one batch and returns its duration `d`, then [`Engine::finish_step`] at `t + d`,
//!   which applies the batch and reports the tokens it produced. The same calls give the same
//!   results on every platform; the discrete-event study and the real-time server share it.
//! - Scheduling follows vLLM V1: running requests first (each gets the rest of its prompt, up
//!   to the budget, or one decode token), then waiting requests in arrival order while a
//!   sequence slot, budget and KV blocks are free. A request that cannot get blocks blocks the
//!   queue (FCFS). A running request that cannot get a block preempts the newest running
//!   request, which goes back to the head of the queue and recomputes.
//! - Prefix caching: at admission the leading prompt blocks already cached are reused, at most
//!   `⌊(prompt − 1) / block⌋` blocks (one token is always computed). A prompt block becomes
//!   reusable by later requests when the step that computes it is scheduled, as vLLM V1's KV
//!   cache manager caches a request's full blocks when it allocates their slots
//!   (`allocate_slots`): a request scheduled after it, even in the same step, reuses it. A
//!   request given its answer's tokens ([`Engine::cache_answer`]) also leaves the complete
//!   blocks of its prompt and answer cached when it finishes, as vLLM caches the blocks its
//!   generated tokens fill (what the next turn of a conversation, which sends them back,
//!   reuses).
//! - Counters are cumulative: prefix-cache queries (prompt tokens at each admission) and hits
//!   (tokens reused), as vLLM's `prefix_cache_queries`/`prefix_cache_hits`; and the timing
//!   histograms' sums and counts, in engine time (the sum of the durations of the steps run):
//!   prefill time from the start of the step that first schedules a request to the end of the
//!   step that produces its first token (vLLM's `request_prefill_time`), and the gaps between a
//!   request's consecutive tokens (vLLM's `inter_token_latency`). When a request finishes, as
//!   vLLM records its finished-request histograms: its queue time (`request_queue_time`),
//!   from when the engine took it (its submission, or the end of the step in progress then:
//!   vLLM's engine core takes new requests between steps) to the start of the step that first
//!   schedules it; its decode time (`request_decode_time`), from its first token to its last;
//!   its prompt and output tokens (`request_prompt_tokens`, `request_generation_tokens`).
//!   Those four count the `finished` requests (aborted ones are not counted, as in vLLM).
//! - KV events (off unless [`Engine::record_kv_events`]): every prompt block cached (when its
//!   step is scheduled, or by [`Engine::prime`]), every cached block evicted and every cache reset
//!   is recorded as a [`BlockEvent`], in order, as vLLM publishes them; [`Engine::drain_kv_events`]
//!   takes them.

mod cache;
mod config;

pub use config::{EngineConfig, EngineConfigError, StepTimeModel};

use std::collections::VecDeque;

use cache::BlockPool;
use xxhash_rust::xxh64::xxh64;

/// One change to the engine's prefix cache (vLLM's KV-cache events, one block each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockEvent {
    /// A prompt block was cached.
    Stored {
        /// Its chained hash (see [`block_hashes`]): the engine's own, opaque to routers.
        hash: u64,
        /// The hash of the block before it; `None` for a prompt's first block.
        parent: Option<u64>,
        /// Its `block_size` tokens.
        tokens: Vec<u32>,
    },
    /// A cached block was evicted.
    Removed {
        /// Its hash.
        hash: u64,
    },
    /// Every cached block was dropped (a prefix-cache reset).
    Cleared,
}

/// An engine-local request id chosen by the driver (unique among live requests).
pub type RequestId = u64;

/// A request rejected at submission.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The prompt has no token.
    #[error("prompt is empty")]
    EmptyPrompt,
    /// `max_tokens` is 0.
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// Prompt + output exceed `max_model_len`.
    #[error("prompt of {prompt} tokens + {max_tokens} output tokens exceeds max-model-len {max_model_len}")]
    TooLong {
        /// Prompt tokens.
        prompt: u32,
        /// Output tokens asked for.
        max_tokens: u32,
        /// The engine's limit.
        max_model_len: u32,
    },
    /// A live request already has this id.
    #[error("request id {0} is already in use")]
    DuplicateId(RequestId),
}

/// One token produced by a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEvent {
    /// The request.
    pub id: RequestId,
    /// Output tokens generated so far, this one included (1 for the first token).
    pub generated: u32,
    /// Prompt tokens served from the prefix cache at the request's (last) admission.
    pub cached_tokens: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Whether this was the last token (the request's output length reached); the request is
    /// gone.
    pub finished: bool,
}

/// A snapshot of the engine's counters and gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct EngineCounters {
    /// Prompt tokens looked up in the prefix cache (cumulative).
    pub prefix_cache_queries: u64,
    /// Prompt tokens found there (cumulative).
    pub prefix_cache_hits: u64,
    /// Requests running now.
    pub running: u32,
    /// Requests waiting now.
    pub waiting: u32,
    /// Share of KV blocks held by requests, 0..=1.
    pub kv_usage: f64,
    /// Steps run (cumulative).
    pub steps: u64,
    /// Preemptions (cumulative).
    pub preemptions: u64,
    /// Cached blocks evicted (cumulative).
    pub evictions: u64,
    /// Prompt tokens computed, not reused (cumulative).
    pub prompt_tokens_computed: u64,
    /// Output tokens generated (cumulative).
    pub generation_tokens: u64,
    /// Requests finished (cumulative).
    pub finished: u64,
    /// Prefill times summed, µs of engine time (cumulative).
    pub prefill_time_us: u64,
    /// Requests whose first token came (cumulative).
    pub prefills: u64,
    /// Gaps between consecutive output tokens summed, µs of engine time (cumulative).
    pub inter_token_time_us: u64,
    /// Gaps counted in `inter_token_time_us` (cumulative).
    pub inter_tokens: u64,
    /// Queue times of the finished requests summed, µs of engine time (cumulative; see the
    /// module docs).
    pub queue_time_us: u64,
    /// Decode times (first token to last) of the finished requests summed, µs of engine time
    /// (cumulative).
    pub decode_time_us: u64,
    /// Prompt tokens of the finished requests (whole prompts, cached or not; cumulative).
    pub request_prompt_tokens: u64,
    /// Output tokens of the finished requests (cumulative).
    pub request_generation_tokens: u64,
}

impl EngineCounters {
    /// Adds `earlier`'s cumulative counters (an engine this one replaced) to this one's; the
    /// gauges (`running`, `waiting`, `kv_usage`) stay this engine's.
    pub fn accumulate(&mut self, earlier: &EngineCounters) {
        for (mine, theirs) in [
            (&mut self.prefix_cache_queries, earlier.prefix_cache_queries),
            (&mut self.prefix_cache_hits, earlier.prefix_cache_hits),
            (&mut self.steps, earlier.steps),
            (&mut self.preemptions, earlier.preemptions),
            (&mut self.evictions, earlier.evictions),
            (
                &mut self.prompt_tokens_computed,
                earlier.prompt_tokens_computed,
            ),
            (&mut self.generation_tokens, earlier.generation_tokens),
            (&mut self.finished, earlier.finished),
            (&mut self.prefill_time_us, earlier.prefill_time_us),
            (&mut self.prefills, earlier.prefills),
            (&mut self.inter_token_time_us, earlier.inter_token_time_us),
            (&mut self.inter_tokens, earlier.inter_tokens),
            (&mut self.queue_time_us, earlier.queue_time_us),
            (&mut self.decode_time_us, earlier.decode_time_us),
            (
                &mut self.request_prompt_tokens,
                earlier.request_prompt_tokens,
            ),
            (
                &mut self.request_generation_tokens,
                earlier.request_generation_tokens,
            ),
        ] {
            *mine += theirs;
        }
    }
}

#[derive(Debug)]
struct Req {
    id: RequestId,
    prompt_len: u32,
    // Output tokens it generates before it stops (`max_tokens`, or fewer: EOS).
    output_tokens: u32,
    // Chained hashes of the prompt's complete blocks.
    hashes: Vec<u64>,
    // The prompt's tokens, kept only while KV events are recorded.
    tokens: Vec<u32>,
    // Prompt followed by answer, as the next turn sends them (see `Engine::cache_answer`):
    // cached when it finishes.
    answer: Option<Vec<u32>>,
    // Tokens in the KV cache.
    computed: u32,
    generated: u32,
    // Leading prompt blocks held as cached (shared) blocks.
    shared: Vec<u64>,
    // Blocks held privately.
    private: u32,
    cached_tokens: u32,
    // Engine time when the engine took it (see the module docs), µs.
    queued_us: u64,
    // Engine time of the step that first scheduled it, µs.
    scheduled_us: Option<u64>,
    // Engine time of its first and latest token, µs.
    first_token_us: u64,
    last_token_us: u64,
}

impl Req {
    fn num_tokens(&self) -> u32 {
        self.prompt_len + self.generated
    }
    fn blocks_held(&self) -> u32 {
        self.shared.len() as u32 + self.private
    }
}

#[derive(Debug, Clone, Copy)]
struct Scheduled {
    id: RequestId,
    tokens: u32,
}

/// One simulated replica. See the module docs for the contract.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    pool: BlockPool,
    waiting: VecDeque<Req>,
    running: Vec<Req>,
    batch: Vec<Scheduled>,
    in_step: bool,
    // Durations of the finished steps summed, and the duration of the step in progress, µs.
    clock_us: u64,
    step_us: u64,
    counters: EngineCounters,
}

/// The chained hashes of the complete `block_size`-token blocks of `tokens`.
pub fn block_hashes(tokens: &[u32], block_size: u32) -> Vec<u64> {
    let mut parent = 0x6b76_7369_6d00_0001u64;
    let mut buf = Vec::with_capacity(8 + 4 * block_size as usize);
    tokens
        .chunks_exact(block_size.max(1) as usize)
        .map(|block| {
            buf.clear();
            buf.extend_from_slice(&parent.to_le_bytes());
            for t in block {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            parent = xxh64(&buf, 0);
            parent
        })
        .collect()
}

impl Engine {
    /// An idle engine with an empty cache.
    pub fn new(config: EngineConfig) -> Result<Engine, EngineConfigError> {
        config.validate()?;
        Ok(Engine {
            pool: BlockPool::new(config.kv_capacity_blocks),
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            batch: Vec::new(),
            in_step: false,
            clock_us: 0,
            step_us: 0,
            counters: EngineCounters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request (FCFS) with the prompt's token ids; it generates `max_tokens` tokens
    /// (as with `ignore_eos`).
    pub fn submit(
        &mut self,
        id: RequestId,
        tokens: &[u32],
        max_tokens: u32,
    ) -> Result<(), SubmitError> {
        self.submit_stopping(id, tokens, max_tokens, max_tokens)
    }

    /// Queues a request that asks for `max_tokens` but stops (at EOS) after `output_tokens`,
    /// clamped to `1..=max_tokens`. It is accepted or refused on `max_tokens`, as vLLM checks
    /// prompt + `max_tokens` against `max_model_len`.
    pub fn submit_stopping(
        &mut self,
        id: RequestId,
        tokens: &[u32],
        max_tokens: u32,
        output_tokens: u32,
    ) -> Result<(), SubmitError> {
        let prompt = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        if prompt == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if max_tokens == 0 {
            return Err(SubmitError::ZeroMaxTokens);
        }
        if u64::from(prompt) + u64::from(max_tokens) > u64::from(self.config.max_model_len) {
            return Err(SubmitError::TooLong {
                prompt,
                max_tokens,
                max_model_len: self.config.max_model_len,
            });
        }
        if self.contains(id) {
            return Err(SubmitError::DuplicateId(id));
        }
        let hashes = if self.config.prefix_caching {
            block_hashes(tokens, self.config.block_size)
        } else {
            Vec::new()
        };
        let kept = if self.pool.recording() {
            tokens.to_vec()
        } else {
            Vec::new()
        };
        // Submitted during a step, it is taken when the step ends.
        let queued_us = self.clock_us + if self.in_step { self.step_us } else { 0 };
        self.waiting.push_back(Req {
            id,
            prompt_len: prompt,
            output_tokens: output_tokens.clamp(1, max_tokens),
            hashes,
            tokens: kept,
            answer: None,
            computed: 0,
            generated: 0,
            shared: Vec::new(),
            private: 0,
            cached_tokens: 0,
            queued_us,
            scheduled_us: None,
            first_token_us: 0,
            last_token_us: 0,
        });
        Ok(())
    }

    /// Gives the queued request `id` its answer: `tokens` is its prompt followed by its answer,
    /// tokenized as a conversation's next turn sends them back. When it finishes, the complete
    /// blocks of `tokens` that it computed (its prompt and the tokens it generated, less the
    /// last, which is never computed) are cached, as vLLM caches the blocks generated tokens
    /// fill. False, changing nothing, if no queued request has that id.
    pub fn cache_answer(&mut self, id: RequestId, tokens: Vec<u32>) -> bool {
        match self.waiting.iter_mut().find(|r| r.id == id) {
            Some(r) => {
                r.answer = Some(tokens);
                true
            }
            None => false,
        }
    }

    /// The prompt tokens of `tokens` an admission would reuse from the cache now (its leading
    /// cached blocks, at most `⌊(prompt − 1) / block⌋`), without touching the cache.
    pub fn cached_prefix_tokens(&self, tokens: &[u32]) -> u32 {
        if !self.config.prefix_caching || tokens.is_empty() {
            return 0;
        }
        let bs = self.config.block_size;
        let max_blocks = (tokens.len() - 1) / bs as usize;
        let hashes = block_hashes(&tokens[..max_blocks * bs as usize], bs);
        self.pool.longest_prefix(&hashes) as u32 * bs
    }

    /// Whether a live request has this id.
    pub fn contains(&self, id: RequestId) -> bool {
        self.running.iter().chain(&self.waiting).any(|r| r.id == id)
    }

    /// Whether there is anything to schedule.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Caches a prompt's complete blocks as if a request had just run it (no time passes).
    pub fn prime(&mut self, tokens: &[u32]) {
        if self.config.prefix_caching {
            // Blocks already cached are skipped (and keep their place in the LRU order).
            let bs = self.config.block_size as usize;
            let hashes = block_hashes(tokens, self.config.block_size);
            self.pool.prime(&hashes, |pool, i| {
                if pool.recording() {
                    pool.log(BlockEvent::Stored {
                        hash: hashes[i],
                        parent: i.checked_sub(1).map(|p| hashes[p]),
                        tokens: tokens[i * bs..(i + 1) * bs].to_vec(),
                    });
                }
            });
        }
    }

    /// Starts (or stops) recording KV events; see the module docs.
    pub fn record_kv_events(&mut self, on: bool) {
        self.pool.record_events(on);
    }

    /// Moves the KV events recorded since the last call to `out`, oldest first.
    pub fn drain_kv_events(&mut self, out: &mut Vec<BlockEvent>) {
        self.pool.drain_events(out);
    }

    /// Whether [`Engine::reset_prefix_cache`] would succeed now: no request holds a cached
    /// block.
    pub fn can_reset_prefix_cache(&self) -> bool {
        self.pool.can_reset()
    }

    /// Forgets every cached block not held by a request; false (nothing changes) while
    /// requests hold cached blocks.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset()
    }

    /// Removes a request (client gone). Its blocks are released; a request in the current
    /// step is dropped from its results. Returns whether it was live.
    pub fn abort(&mut self, id: RequestId) -> bool {
        self.batch.retain(|s| s.id != id);
        if let Some(i) = self.running.iter().position(|r| r.id == id) {
            let r = self.running.remove(i);
            self.release(&r);
            return true;
        }
        if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            if let Some(r) = self.waiting.remove(i) {
                self.release(&r);
            }
            return true;
        }
        false
    }

    /// The counters and gauges now.
    pub fn counters(&self) -> EngineCounters {
        EngineCounters {
            running: self.running.len() as u32,
            waiting: self.waiting.len() as u32,
            kv_usage: f64::from(self.pool.in_use()) / f64::from(self.pool.capacity()),
            evictions: self.pool.evictions(),
            ..self.counters
        }
    }

    fn release(&mut self, r: &Req) {
        self.pool.release(&r.shared);
        self.pool.free_private(r.private);
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.config.block_size)
    }

    /// Moves the newest running request back to the head of the queue, freeing its blocks.
    fn preempt_last(&mut self) {
        if let Some(mut r) = self.running.pop() {
            self.release(&r);
            r.shared.clear();
            r.private = 0;
            r.computed = 0;
            self.counters.preemptions += 1;
            self.waiting.push_front(r);
        }
    }

    /// Caches the complete prompt blocks the `n` tokens just scheduled for running request `i`
    /// fill, as vLLM V1 caches them when it allocates their slots (before the step computes
    /// them): a request scheduled later, in this step or after, reuses them.
    fn cache_scheduled(&mut self, i: usize, n: u32) {
        let bs = self.config.block_size;
        let r = &mut self.running[i];
        let full = ((r.computed + n).min(r.prompt_len) / bs) as usize;
        while r.shared.len() < full.min(r.hashes.len()) {
            let h = r.hashes[r.shared.len()];
            if !self.pool.promote(h) {
                break;
            }
            if self.pool.recording() {
                let i = r.shared.len();
                let b = bs as usize;
                self.pool.log(BlockEvent::Stored {
                    hash: h,
                    parent: i.checked_sub(1).map(|p| r.hashes[p]),
                    tokens: r.tokens[i * b..(i + 1) * b].to_vec(),
                });
            }
            r.private -= 1;
            r.shared.push(h);
        }
    }

    /// Schedules one batch at the current time and returns its duration in µs, or `None` if
    /// there is nothing to run (or a step is already in progress).
    pub fn start_step(&mut self) -> Option<u64> {
        if self.in_step || !self.has_work() {
            return None;
        }
        self.batch.clear();
        let mut budget = self.config.max_num_batched_tokens;
        let mut decode_seqs = 0u32;
        let mut prefill_tokens = 0u32;
        let mut preempted = false;

        // 1. Running requests, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let (want, held) = {
                let r = &self.running[i];
                (r.num_tokens() - r.computed, r.blocks_held())
            };
            let n = want.min(budget);
            let need = self
                .blocks_for(self.running[i].computed + n)
                .saturating_sub(held);
            if need > 0 && !self.pool.reserve(need) {
                // Preempt the newest running request (possibly this one) and retry.
                let last = self.running.len() - 1;
                self.preempt_last();
                preempted = true;
                if last == i {
                    break;
                }
                continue;
            }
            self.running[i].private += need;
            self.cache_scheduled(i, n);
            let r = &mut self.running[i];
            if r.computed >= r.prompt_len && n == 1 {
                decode_seqs += 1;
            } else {
                prefill_tokens += n;
            }
            budget -= n;
            self.batch.push(Scheduled {
                id: r.id,
                tokens: n,
            });
            i += 1;
        }

        // 2. Waiting requests, FCFS, unless this step preempted.
        while !preempted && budget > 0 && (self.running.len() as u32) < self.config.max_num_seqs {
            let Some(head) = self.waiting.front() else {
                break;
            };
            let bs = self.config.block_size;
            let max_hit_blocks = ((head.num_tokens() - 1) / bs) as usize;
            let hit_blocks = self
                .pool
                .longest_prefix(&head.hashes[..head.hashes.len().min(max_hit_blocks)]);
            let hit_tokens = hit_blocks as u32 * bs;
            let n = (head.num_tokens() - hit_tokens).min(budget);
            let need = self.blocks_for(hit_tokens + n) - hit_blocks as u32;
            let hit: Vec<u64> = head.hashes[..hit_blocks].to_vec();
            self.pool.acquire(&hit);
            if !self.pool.reserve(need) {
                self.pool.release(&hit);
                break;
            }
            let Some(mut r) = self.waiting.pop_front() else {
                break;
            };
            r.shared = hit;
            r.private = need;
            r.computed = hit_tokens;
            r.cached_tokens = hit_tokens;
            r.scheduled_us.get_or_insert(self.clock_us);
            self.counters.prefix_cache_queries += u64::from(r.num_tokens());
            self.counters.prefix_cache_hits += u64::from(hit_tokens);
            prefill_tokens += n;
            budget -= n;
            self.batch.push(Scheduled {
                id: r.id,
                tokens: n,
            });
            self.running.push(r);
            self.cache_scheduled(self.running.len() - 1, n);
        }

        if self.batch.is_empty() {
            return None;
        }
        self.in_step = true;
        self.counters.steps += 1;
        self.step_us = self.config.step.step_us(decode_seqs, prefill_tokens);
        Some(self.step_us)
    }

    /// Applies the batch scheduled by [`Engine::start_step`] and appends the tokens it produced
    /// (one per request that completed its scheduled tokens) to `out`. Finished requests leave
    /// the engine. Does nothing if no step is in progress.
    pub fn finish_step(&mut self, out: &mut Vec<TokenEvent>) {
        if !self.in_step {
            return;
        }
        self.in_step = false;
        self.clock_us += self.step_us;
        let end_us = self.clock_us;
        let batch = std::mem::take(&mut self.batch);
        for s in &batch {
            let Some(i) = self.running.iter().position(|r| r.id == s.id) else {
                continue;
            };
            let r = &mut self.running[i];
            let before = r.computed;
            r.computed += s.tokens;
            if before < r.prompt_len {
                self.counters.prompt_tokens_computed +=
                    u64::from(r.computed.min(r.prompt_len) - before);
            }
            if r.computed == r.num_tokens() {
                r.generated += 1;
                self.counters.generation_tokens += 1;
                if r.generated == 1 {
                    self.counters.prefill_time_us += end_us - r.scheduled_us.unwrap_or(end_us);
                    self.counters.prefills += 1;
                    r.first_token_us = end_us;
                } else {
                    self.counters.inter_token_time_us += end_us - r.last_token_us;
                    self.counters.inter_tokens += 1;
                }
                r.last_token_us = end_us;
                let finished = r.generated >= r.output_tokens;
                out.push(TokenEvent {
                    id: r.id,
                    generated: r.generated,
                    cached_tokens: r.cached_tokens,
                    prompt_tokens: r.prompt_len,
                    finished,
                });
                if finished {
                    let r = self.running.remove(i);
                    self.release(&r);
                    if let Some(answer) = &r.answer {
                        let computed = (r.num_tokens() - 1) as usize;
                        self.prime(&answer[..computed.min(answer.len())]);
                    }
                    let c = &mut self.counters;
                    c.finished += 1;
                    let scheduled_us = r.scheduled_us.unwrap_or(r.queued_us);
                    c.queue_time_us += scheduled_us.saturating_sub(r.queued_us);
                    c.decode_time_us += end_us - r.first_token_us;
                    c.request_prompt_tokens += u64::from(r.prompt_len);
                    c.request_generation_tokens += u64::from(r.generated);
                }
            }
        }
        self.batch = batch;
        self.batch.clear();
    }
}

#[cfg(test)]
mod tests;
