//! What one request teaches the model, per the sample rules in the [`super`] docs: the prompt
//! side (its first-token time; its prompt and cached tokens) at the first report that carries
//! each, a first token or the completion, and the decode side at the completion.

use super::{GlobalModel, PodModel, TtftConfig};
use crate::tickets::Timings;

/// What the router remembers about a routed request, for learning at completion.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TicketContext {
    pub(crate) prompt_bytes: f64,
    pub(crate) queue_ms: f64,
    /// The TTFT predicted at routing, ms.
    pub(crate) predicted_ttft_ms: f64,
    pub(crate) uncached_tokens: f64,
    pub(crate) indexed_tokens: f64,
    /// Whether `indexed_tokens` came from an engine view (then the reuse it reports teaches
    /// nothing about how far the router-side index can be trusted).
    pub(crate) exact: bool,
    /// Whether its first-token time (or its absence, at the completion) has been learned from.
    pub(crate) first_token_learned: bool,
    /// Whether its prompt and cached tokens (or their absence) have been learned from.
    pub(crate) usage_learned: bool,
}

/// Learns from one successful completion (see the [`super`] docs for which samples count): the
/// decode side, and what of the prompt side a first-token report has not taught already
/// ([`learn_first_token`]). The context is the request's last: it is consumed.
pub(crate) fn learn(
    pod: &mut PodModel,
    global: &mut GlobalModel,
    cfg: &TtftConfig,
    mut ctx: TicketContext,
    timings: &Timings,
) {
    if let Some(out) = timings.output_tokens {
        global.output_tokens.learn(f64::from(out), cfg);
    }
    pod.decode_timings.note(
        timings.first_token_ms.is_some()
            && timings.output_tokens.is_some()
            && timings.total_ms.is_some(),
    );
    if let (Some(first), Some(total), Some(out)) = (
        timings.first_token_ms,
        timings.total_ms,
        timings.output_tokens,
    ) {
        if out >= 2 && total > first {
            pod.tpot_ms
                .learn((total - first) as f64 / f64::from(out - 1), cfg);
        }
    }
    if !ctx.usage_learned {
        learn_usage(pod, global, cfg, &mut ctx, timings);
    }
    if !ctx.first_token_learned {
        learn_prefill(pod, global, cfg, &mut ctx, timings);
    }
}

/// Learns what a first-token report tells (see the [`super`] docs), each part once per
/// request: its time teaches the pod's prefill rate or overhead; its usage, when it carries
/// prompt tokens (a stream shows usage at its first token only with vLLM's continuous usage
/// stats), teaches bytes per token and `trust`/`extra`, which are otherwise left to the
/// completion. Only `first_token_ms`, `prompt_tokens` and `cached_tokens` are read.
pub(crate) fn learn_first_token(
    pod: &mut PodModel,
    global: &mut GlobalModel,
    cfg: &TtftConfig,
    ctx: &mut TicketContext,
    timings: &Timings,
) {
    if !ctx.usage_learned && timings.prompt_tokens.is_some() {
        learn_usage(pod, global, cfg, ctx, timings);
    }
    if !ctx.first_token_learned {
        learn_prefill(pod, global, cfg, ctx, timings);
    }
}

/// Whether the pod's reports carry prompt and cached tokens; bytes per token; `trust` and
/// `extra`.
fn learn_usage(
    pod: &mut PodModel,
    global: &mut GlobalModel,
    cfg: &TtftConfig,
    ctx: &mut TicketContext,
    timings: &Timings,
) {
    ctx.usage_learned = true;
    pod.cached_tokens
        .note(timings.prompt_tokens.is_some() && timings.cached_tokens.is_some());
    global.prompt_tokens.note(timings.prompt_tokens.is_some());
    if let (Some(tokens), true) = (timings.prompt_tokens, ctx.prompt_bytes > 0.0) {
        global
            .bytes_per_token
            .learn(ctx.prompt_bytes / f64::from(tokens.max(1)), cfg);
    }
    if let (Some(prompt), Some(cached), false) =
        (timings.prompt_tokens, timings.cached_tokens, ctx.exact)
    {
        let (prompt, cached) = (f64::from(prompt), f64::from(cached));
        let indexed = ctx.indexed_tokens.min(prompt);
        pod.learn_reuse(cached, indexed, prompt - indexed, cfg);
    }
}

/// Whether the pod's reports carry first-token times; its prefill rate (from requests that
/// started at once with at least an engine block to prefill: the reported uncached tokens, or
/// the predicted ones) or its overhead (less than a block).
fn learn_prefill(
    pod: &mut PodModel,
    global: &mut GlobalModel,
    cfg: &TtftConfig,
    ctx: &mut TicketContext,
    timings: &Timings,
) {
    ctx.first_token_learned = true;
    pod.first_tokens.note(timings.first_token_ms.is_some());
    let Some(first) = timings.first_token_ms else {
        return;
    };
    pod.calibration
        .record(ctx.predicted_ttft_ms, ctx.queue_ms, first as f64);
    if ctx.queue_ms > 0.0 {
        return;
    }
    let uncached = match (timings.prompt_tokens, timings.cached_tokens) {
        (Some(p), Some(c)) => f64::from(p.saturating_sub(c)),
        _ => ctx.uncached_tokens,
    };
    let first = first as f64;
    if uncached < f64::from(cfg.engine_block_tokens) {
        pod.overhead_ms.learn(first.max(1.0), cfg);
    } else {
        let prefill_ms = first - pod.overhead_ms.get();
        if prefill_ms > 1.0 {
            let sample = uncached / prefill_ms * 1_000.0;
            pod.prefill_tps.learn_measured(sample, cfg);
            global.prefill_tps.learn_measured(sample, cfg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{cfg, job_of, known_pod, t};
    use super::super::*;
    use super::*;

    #[test]
    fn completions_teach_how_far_the_index_is_from_the_engine() {
        let c = cfg();
        let (mut pod, mut g) = (PodModel::new(&c), GlobalModel::new(&c));
        let job = job_of(5_000.0, 0.0);
        // Nothing is known of the pod yet: half of what the index does not know is assumed
        // cached (whole blocks aside), so that a warm pod gets tried.
        let unknown = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(unknown.cached_tokens, 2_500.0);
        let cold = estimate(&known_pod(&c), &g, &c, job, t(0), &mut Vec::new());
        assert_eq!(cold.cached_tokens, 0.0);
        // The index knew nothing, yet the engine reused 4,704 tokens (a warm engine).
        let ctx = TicketContext {
            prompt_bytes: 28_000.0,
            indexed_tokens: 0.0,
            ..Default::default()
        };
        let surprise = crate::tickets::Timings {
            prompt_tokens: Some(5_000),
            cached_tokens: Some(4_704),
            ..Default::default()
        };
        for _ in 0..10 {
            learn(&mut pod, &mut g, &c, ctx, &surprise);
        }
        let warm = estimate(&pod, &g, &c, job, t(0), &mut Vec::new());
        assert!(warm.cached_tokens > 3_500.0, "{warm:?}");
        assert!(warm.ttft_ms < cold.ttft_ms / 2.0);
        // The index promised 4,704 tokens and the engine had none (it evicted them).
        let (mut pod, mut g) = (PodModel::new(&c), GlobalModel::new(&c));
        let ctx = TicketContext {
            indexed_tokens: 4_704.0,
            ..ctx
        };
        let evicted = crate::tickets::Timings {
            prompt_tokens: Some(5_000),
            cached_tokens: Some(0),
            ..Default::default()
        };
        learn(&mut pod, &mut g, &c, ctx, &evicted);
        assert_eq!(pod.trust.get(), 0.0, "the first sample replaces the prior");
        let kept = crate::tickets::Timings {
            cached_tokens: Some(4_704),
            ..evicted
        };
        learn(&mut pod, &mut g, &c, ctx, &kept);
        assert!(
            (pod.trust.get() - 0.5).abs() < 1e-9,
            "the second weighs half"
        );
        for _ in 0..3 {
            learn(&mut pod, &mut g, &c, ctx, &kept);
        }
        assert!(
            (pod.trust.get() - 0.8).abs() < 1e-9,
            "the fifth and later move it by the learning rate (1/5 = 0.2)"
        );
    }

    #[test]
    fn learning_recovers_from_a_wrong_prior_and_resists_outliers() {
        let c = TtftConfig {
            prefill_tokens_per_s: 1_500.0,
            overhead_ms: 0.0,
            ..cfg()
        };
        let (mut pod, mut g) = (PodModel::new(&c), GlobalModel::new(&c));
        let ctx = TicketContext {
            prompt_bytes: 28_000.0,
            queue_ms: 0.0,
            uncached_tokens: 3_000.0,
            ..Default::default()
        };
        let timings = |first| crate::tickets::Timings {
            first_token_ms: Some(first),
            ..Default::default()
        };
        // The first measured prefill replaces the 2× slow prior, the second is averaged in.
        learn(&mut pod, &mut g, &c, ctx, &timings(1_000)); // truth: 3,000 tokens/s
        assert_eq!(pod.prefill_tps.get(), 3_000.0);
        learn(&mut pod, &mut g, &c, ctx, &timings(1_500));
        assert_eq!(
            pod.prefill_tps.get(),
            2_500.0,
            "the mean of 3,000 and 2,000"
        );
        for _ in 0..30 {
            learn(&mut pod, &mut g, &c, ctx, &timings(1_000));
        }
        assert!(
            (pod.prefill_tps.get() - 3_000.0).abs() < 30.0,
            "{}",
            pod.prefill_tps.get()
        );
        learn(&mut pod, &mut g, &c, ctx, &timings(1)); // absurd outlier
        assert!(
            pod.prefill_tps.get() < 3_000.0 * 1.5,
            "one outlier moved the estimate to {}",
            pod.prefill_tps.get()
        );
        let waited = TicketContext {
            queue_ms: 500.0,
            ..ctx
        };
        let before = pod.prefill_tps.get();
        learn(&mut pod, &mut g, &c, waited, &timings(5_000));
        assert_eq!(
            pod.prefill_tps.get(),
            before,
            "queued requests say nothing about prefill speed"
        );
    }

    #[test]
    fn a_pod_without_its_own_prefill_samples_predicts_with_the_fleets_rate() {
        let c = TtftConfig {
            prefill_tokens_per_s: 1_500.0,
            overhead_ms: 0.0,
            ..cfg()
        };
        let (mut a, b, mut g) = (PodModel::new(&c), PodModel::new(&c), GlobalModel::new(&c));
        let ctx = TicketContext {
            queue_ms: 0.0,
            uncached_tokens: 3_000.0,
            ..Default::default()
        };
        let first = crate::tickets::Timings {
            first_token_ms: Some(1_000), // 3,000 tokens/s
            ..Default::default()
        };
        assert_eq!(b.prefill_rate(&g), 1_500.0, "nothing measured: the prior");
        for n in 1..=OWN_PREFILL_SAMPLES {
            learn(&mut a, &mut g, &c, ctx, &first);
            assert_eq!(a.prefill_rate(&g), 3_000.0);
            assert_eq!(
                b.prefill_rate(&g),
                3_000.0,
                "b has measured nothing: the fleet's"
            );
            assert_eq!(a.prefill_tps.measured(), n);
        }
        // A pod with samples of its own keeps its own rate once it has enough of them.
        let mut b = b;
        let slow = crate::tickets::Timings {
            first_token_ms: Some(2_000), // 1,500 tokens/s
            ..first
        };
        for _ in 0..OWN_PREFILL_SAMPLES {
            learn(&mut b, &mut g, &c, ctx, &slow);
        }
        assert_eq!(b.prefill_rate(&g), 1_500.0);
        assert_eq!(a.prefill_rate(&g), 3_000.0);
    }

    #[test]
    fn completions_say_which_rates_they_can_teach() {
        let c = cfg();
        let (mut pod, mut g) = (PodModel::new(&c), GlobalModel::new(&c));
        let ctx = TicketContext::default();
        let total_only = crate::tickets::Timings {
            total_ms: Some(9_000),
            ..Default::default()
        };
        learn(&mut pod, &mut g, &c, ctx, &total_only);
        assert_eq!(
            (pod.first_tokens, pod.decode_timings),
            (Reports::Missing, Reports::Missing)
        );
        // A first token without output tokens (a timed response without usage) speaks for the
        // prefill side only.
        let first_only = crate::tickets::Timings {
            first_token_ms: Some(500),
            ..total_only
        };
        learn(&mut pod, &mut g, &c, ctx, &first_only);
        assert_eq!(
            (pod.first_tokens, pod.decode_timings),
            (Reports::Present, Reports::Missing)
        );
        let both = crate::tickets::Timings {
            output_tokens: Some(100),
            ..first_only
        };
        learn(&mut pod, &mut g, &c, ctx, &both);
        assert_eq!(pod.decode_timings, Reports::Present);
        learn(&mut pod, &mut g, &c, ctx, &total_only);
        assert_eq!(
            (pod.first_tokens, pod.decode_timings),
            (Reports::Present, Reports::Present),
            "once present, for good"
        );
    }
}
