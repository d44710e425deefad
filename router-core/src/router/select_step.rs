//! Steps 2 and 3 of routing: the TTFT model's estimates and the strategy's pick.

use super::{JobSize, Picked, RouteRequest, Router};
use crate::decision::Reason;
use crate::select::{self, PrefixCacheParams};
use crate::strategy::Strategy;
use crate::time::Timestamp;
use crate::ttft;

impl Router {
    /// Step 2: the TTFT model's estimate for every candidate when the strategy (`None` = the
    /// default) needs it or `all` asks for them (else none; the winner's is computed at
    /// commit). Returns the request's size as the model sees it.
    pub(super) fn estimates(
        &mut self,
        req: &RouteRequest<'_>,
        total_blocks: u32,
        now: Timestamp,
        all: bool,
    ) -> JobSize {
        let spec = req.strategy.unwrap_or(&self.config.default_strategy);
        let pods = &self.registry.pods;
        let s = &mut self.scratch;
        s.session = select::session_affinity::target(
            req.session_id,
            s.cands.iter().map(|c| {
                let p = &pods[c.pod.index()];
                (&*p.address, p.data_parallel_rank)
            }),
        );
        let session_pod = s.session.map_or(usize::MAX, |i| s.cands[i].pod.index());
        let answer_tokens = self.global.output_tokens.get();
        let unrouted_extra =
            ttft::unrouted_extra(s.cands.iter().map(|c| &pods[c.pod.index()].model));
        let probe_extra = ttft::probe_extra(unrouted_extra);
        let mut size = match req.tokens {
            Some(t) => JobSize {
                prompt_bytes: 0.0,
                prompt_tokens: f64::from(t.prompt_tokens),
                block_tokens: f64::from(t.block_tokens),
                max_output_tokens: req.max_output_tokens,
                session_pod,
                answer_tokens,
                probe_extra,
                unrouted_extra,
                sent_tokens: 0.0,
            },
            None => {
                let block = self.hash.block_size() as f64;
                let prompt_bytes = if total_blocks == 0 {
                    0.0
                } else {
                    f64::from(total_blocks) * block + block / 2.0
                };
                let bytes_per_token = self.global.bytes_per_token.get();
                JobSize {
                    prompt_bytes,
                    prompt_tokens: prompt_bytes / bytes_per_token,
                    block_tokens: block / bytes_per_token,
                    max_output_tokens: req.max_output_tokens,
                    session_pod,
                    answer_tokens,
                    probe_extra,
                    unrouted_extra,
                    sent_tokens: 0.0,
                }
            }
        };
        size.sent_tokens = s
            .cands
            .iter()
            .map(|c| size.job(c, false))
            .map(|j| j.matched_tokens + j.session_tokens)
            .fold(0.0, f64::max);
        let s = &mut self.scratch;
        s.estimates.clear();
        s.costs.clear();
        s.reuse.clear();
        let engine_block = f64::from(self.config.ttft.engine_block_tokens);
        if all || spec.contains(Strategy::LeastTtft) {
            for (c, &exact) in s.cands.iter().zip(&s.exact) {
                let pod = &self.registry.pods[c.pod.index()].model;
                let e = ttft::estimate(
                    pod,
                    &self.global,
                    &self.config.ttft,
                    size.job(c, exact),
                    now,
                    &mut s.ends,
                );
                s.costs.push(e.cost_ms());
                s.reuse
                    .push((e.cached_tokens / engine_block).round() as u32);
                s.estimates.push(e);
            }
        }
        size
    }

    /// Step 3: the strategy's pick among the candidates (the only step that draws from the
    /// PRNG).
    pub(super) fn select(
        &mut self,
        req: &RouteRequest<'_>,
        total_blocks: u32,
        now: Timestamp,
    ) -> Picked {
        let spec = req.strategy.unwrap_or(&self.config.default_strategy);
        let s = &mut self.scratch;
        // What the AIBrix metric strategies read, only when the spec has one.
        s.metrics.clear();
        if spec
            .entries()
            .iter()
            .any(|(st, _)| select::reads_metrics(*st))
        {
            let max_age = self.config.ttft.snapshot_max_age_ms;
            for c in &s.cands {
                let pod = &mut self.registry.pods[c.pod.index()];
                s.metrics.push(select::PodMetrics {
                    engine: pod
                        .model
                        .engine
                        .filter(|e| now.millis_since(e.at) <= max_age)
                        .map(|e| e.snapshot),
                    busy_ratio: pod.busy.ratio(now),
                });
            }
        }
        let session = if spec.contains(Strategy::SessionAffinity) {
            s.session
        } else {
            None
        };
        let inputs = select::Inputs {
            cands: &s.cands,
            total_blocks,
            cost_ms: &s.costs,
            metrics: &s.metrics,
            session,
        };
        let mut runner_up = None;
        let single = spec.as_single();
        let (index, reason, imbalance) = match single {
            Some(Strategy::Random) => (
                select::random(&s.cands, &mut self.rng),
                Reason::Random,
                false,
            ),
            Some(Strategy::LeastRequest) => (
                select::least_loaded(&s.cands, &mut self.rng),
                Reason::LeastRequest,
                false,
            ),
            Some(Strategy::LeastTtft) => {
                let (i, r) = select::least_ttft(
                    &s.cands,
                    &s.costs,
                    &s.reuse,
                    self.config.ttft.tie_ms,
                    &mut self.rng,
                    &mut s.order,
                );
                runner_up = r;
                match select::explore(i, &s.estimates, &s.costs, self.config.ttft.explore_wait_ms) {
                    Some(probe) => {
                        runner_up = Some(i);
                        (probe, Reason::LeastTtftProbe, false)
                    }
                    None => (i, Reason::LeastTtft, false),
                }
            }
            Some(Strategy::PrefixCache) => {
                let params = PrefixCacheParams {
                    imbalance_abs_count: self.config.imbalance_abs_count,
                    stddev_factor: self.config.stddev_factor,
                };
                let p = select::prefix_cache(
                    &s.cands,
                    total_blocks,
                    params,
                    &mut self.rng,
                    &mut s.order,
                );
                (p.index, p.reason, p.imbalance)
            }
            Some(Strategy::PowerOfTwo) => (
                select::power_of_two(&s.cands, &mut self.rng),
                Reason::PowerOfTwo,
                false,
            ),
            Some(Strategy::SessionAffinity) => match session {
                Some(i) => (i, Reason::SessionAffinity, false),
                None => (
                    select::random(&s.cands, &mut self.rng),
                    Reason::Random,
                    false,
                ),
            },
            Some(
                st @ (Strategy::LeastKvCache
                | Strategy::LeastGpuCache
                | Strategy::LeastBusyTime
                | Strategy::LeastLatency
                | Strategy::Throughput
                | Strategy::LeastUtilization),
            ) => {
                inputs.scores(st, &mut self.rng, &mut s.scores);
                match select::least_scored(&s.scores, &mut self.rng) {
                    Some(i) => (i, metric_reason(st), false),
                    // No candidate has the metric: uniform, as AIBrix falls back.
                    None => (
                        select::random(&s.cands, &mut self.rng),
                        Reason::Random,
                        false,
                    ),
                }
            }
            None => {
                let i = select::weighted(
                    &inputs,
                    spec,
                    &mut self.rng,
                    &mut s.scores,
                    &mut s.totals,
                    &mut s.order,
                );
                (i, Reason::Weighted, false)
            }
        };
        Picked {
            index,
            strategy: single,
            reason,
            imbalance,
            runner_up,
            total_blocks,
            session: spec.contains(Strategy::SessionAffinity) || spec.contains(Strategy::LeastTtft),
        }
    }
}

/// The reason a metric strategy gives when its least score wins.
fn metric_reason(s: Strategy) -> Reason {
    match s {
        Strategy::LeastKvCache => Reason::LeastKvCache,
        Strategy::LeastGpuCache => Reason::LeastGpuCache,
        Strategy::LeastBusyTime => Reason::LeastBusyTime,
        Strategy::LeastLatency => Reason::LeastLatency,
        Strategy::Throughput => Reason::Throughput,
        _ => Reason::LeastUtilization,
    }
}
