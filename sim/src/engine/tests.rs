use super::*;

fn run_to_end(e: &mut Engine) -> (u64, Vec<(u64, TokenEvent)>) {
    let mut t = 0u64;
    let mut all = Vec::new();
    let mut out = Vec::new();
    while let Some(d) = e.start_step() {
        t += d;
        out.clear();
        e.finish_step(&mut out);
        all.extend(out.iter().map(|ev| (t, *ev)));
    }
    (t, all)
}

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len)
        .map(|i| seed.wrapping_mul(7919).wrapping_add(i))
        .collect()
}

#[test]
fn decode_step_at_eight_sequences_is_57ms() {
    assert_eq!(StepTimeModel::default().step_us(8, 0), 57_000);
}

#[test]
fn second_request_reuses_whole_blocks_only() {
    let mut e = Engine::new(EngineConfig::default()).unwrap();
    let p = prompt(1, 5000);
    e.submit(1, &p, 4).unwrap();
    let (_, ev) = run_to_end(&mut e);
    assert_eq!(ev.len(), 4);
    assert!(ev[3].1.finished);
    assert_eq!(ev[0].1.cached_tokens, 0);
    e.submit(2, &p, 4).unwrap();
    let (_, ev) = run_to_end(&mut e);
    assert_eq!(ev[0].1.cached_tokens, 3 * 1568);
    let c = e.counters();
    assert_eq!(c.prefix_cache_queries, 10_000);
    assert_eq!(c.prefix_cache_hits, 3 * 1568);
    assert_eq!(c.kv_usage, 0.0);
}

/// vLLM V1 caches a request's complete blocks when it allocates their slots, so a request
/// admitted later in the same step reuses the blocks the step is computing for an earlier one.
#[test]
fn a_request_admitted_in_the_same_step_reuses_the_blocks_being_computed() {
    let mut e = Engine::new(EngineConfig::default()).unwrap();
    let p = prompt(1, 5000);
    e.submit(1, &p, 4).unwrap();
    e.submit(2, &p, 4).unwrap();
    let d = e.start_step().expect("a step");
    assert_eq!(e.counters().running, 2);
    assert_eq!(e.counters().prefix_cache_hits, 3 * 1568);
    // One step computes the first prompt and the second's uncached tail, no more.
    assert_eq!(
        d,
        StepTimeModel::default().step_us(0, 5000 + (5000 - 3 * 1568))
    );
    let mut out = Vec::new();
    e.finish_step(&mut out);
    let cached: Vec<(u64, u32)> = out.iter().map(|ev| (ev.id, ev.cached_tokens)).collect();
    assert_eq!(cached, [(1, 0), (2, 3 * 1568)]);
}

#[test]
fn at_most_max_num_seqs_run_and_the_rest_wait_fcfs() {
    let mut e = Engine::new(EngineConfig::default()).unwrap();
    for id in 0..10 {
        e.submit(id, &prompt(id as u32, 100), 3).unwrap();
    }
    assert!(e.start_step().is_some());
    assert_eq!(e.counters().running, 8);
    assert_eq!(e.counters().waiting, 2);
    let mut out = Vec::new();
    e.finish_step(&mut out);
    assert_eq!(out.len(), 8);
    let (_, ev) = run_to_end(&mut e);
    let finished: Vec<u64> = ev
        .iter()
        .filter(|(_, e)| e.finished)
        .map(|(_, e)| e.id)
        .collect();
    assert_eq!(finished, (0..10).collect::<Vec<_>>());
}

#[test]
fn long_prefill_is_chunked_by_the_budget() {
    let cfg = EngineConfig {
        max_num_batched_tokens: 1000,
        ..Default::default()
    };
    let mut e = Engine::new(cfg).unwrap();
    e.submit(1, &prompt(3, 2500), 1).unwrap();
    let mut out = Vec::new();
    let mut steps = 0;
    while let Some(_d) = e.start_step() {
        steps += 1;
        e.finish_step(&mut out);
    }
    assert_eq!(steps, 3);
    assert_eq!(out.len(), 1);
}

#[test]
fn small_capacity_preempts_and_still_finishes_everything() {
    let cfg = EngineConfig {
        block_size: 16,
        kv_capacity_blocks: 12,
        max_model_len: 160,
        ..Default::default()
    };
    let mut e = Engine::new(cfg).unwrap();
    for id in 0..4 {
        e.submit(id, &prompt(id as u32, 40), 60).unwrap();
    }
    let (_, ev) = run_to_end(&mut e);
    assert_eq!(ev.iter().filter(|(_, e)| e.finished).count(), 4);
    assert!(e.counters().preemptions > 0);
    assert_eq!(e.counters().kv_usage, 0.0);
}

#[test]
fn an_answer_that_stops_at_eos_is_accepted_on_max_tokens() {
    let mut e = Engine::new(EngineConfig::default()).unwrap();
    e.submit_stopping(1, &prompt(1, 100), 50, 3).unwrap();
    let (_, ev) = run_to_end(&mut e);
    assert_eq!(ev.len(), 3);
    assert!(ev[2].1.finished && ev[2].1.generated == 3);
    assert_eq!(e.counters().generation_tokens, 3);
    // Clamped to 1..=max_tokens.
    e.submit_stopping(2, &prompt(2, 100), 2, 9).unwrap();
    assert_eq!(run_to_end(&mut e).1.len(), 2);
    e.submit_stopping(3, &prompt(3, 100), 2, 0).unwrap();
    assert_eq!(run_to_end(&mut e).1.len(), 1);
    // Fits with its output, not with what it asked for: refused, as vLLM refuses it.
    assert!(matches!(
        e.submit_stopping(4, &prompt(4, 32_000), 1_000, 10),
        Err(SubmitError::TooLong {
            max_tokens: 1_000,
            ..
        })
    ));
}

#[test]
fn bad_requests_are_errors() {
    let mut e = Engine::new(EngineConfig::default()).unwrap();
    assert_eq!(e.submit(1, &[], 1), Err(SubmitError::EmptyPrompt));
    assert_eq!(e.submit(1, &[1], 0), Err(SubmitError::ZeroMaxTokens));
    assert!(matches!(
        e.submit(1, &prompt(1, 32_700), 100),
        Err(SubmitError::TooLong { .. })
    ));
    e.submit(1, &[1], 1).unwrap();
    assert_eq!(e.submit(1, &[1], 1), Err(SubmitError::DuplicateId(1)));
    assert!(e.abort(1));
    assert!(!e.has_work());
}

#[test]
fn invalid_config_is_rejected() {
    assert!(Engine::new(EngineConfig {
        max_num_seqs: 0,
        ..Default::default()
    })
    .is_err());
    assert!(Engine::new(EngineConfig {
        kv_capacity_blocks: 2,
        ..Default::default()
    })
    .is_err());
}

#[test]
fn timing_counters_follow_vllm_prefill_time_and_inter_token_gaps() {
    let mut e = Engine::new(EngineConfig::default()).unwrap();
    e.submit(1, &prompt(1, 5000), 4).unwrap();
    let (end, ev) = run_to_end(&mut e);
    let first = ev[0].0;
    let c = e.counters();
    // One request scheduled at engine time 0: its prefill time is its first token's time,
    // and its three gaps add up to the rest.
    assert_eq!((c.prefills, c.prefill_time_us), (1, first));
    assert_eq!((c.inter_tokens, c.inter_token_time_us), (3, end - first));
}

#[test]
fn finished_requests_count_queue_and_decode_time_and_their_tokens_as_vllm_does() {
    let mut e = Engine::new(EngineConfig {
        max_num_seqs: 1,
        ..Default::default()
    })
    .unwrap();
    e.submit(1, &prompt(1, 100), 3).unwrap();
    let d1 = e.start_step().unwrap();
    // Submitted during the first step: the engine takes them when it ends. The third is
    // aborted while it waits: not counted.
    e.submit(2, &prompt(2, 200), 2).unwrap();
    e.submit(3, &prompt(3, 50), 5).unwrap();
    let mut out = Vec::new();
    e.finish_step(&mut out);
    assert_eq!(e.counters().finished, 0);
    assert_eq!(
        (e.counters().queue_time_us, e.counters().decode_time_us),
        (0, 0)
    );
    assert!(e.abort(3));
    let (_, rest) = run_to_end(&mut e);
    let at = |id: u64, generated: u32| {
        d1 + rest
            .iter()
            .find(|(_, ev)| ev.id == id && ev.generated == generated)
            .unwrap()
            .0
    };
    let c = e.counters();
    assert_eq!(c.finished, 2);
    // Request 2 waits from the end of the first step until request 1's last token (one
    // sequence at a time); request 1 never waited.
    assert_eq!(c.queue_time_us, at(1, 3) - d1);
    assert_eq!(c.decode_time_us, (at(1, 3) - d1) + (at(2, 2) - at(2, 1)));
    assert_eq!(c.decode_time_us, c.inter_token_time_us);
    assert_eq!(
        (c.request_prompt_tokens, c.request_generation_tokens),
        (300, 5)
    );
    // Submitted to an idle engine, a request is scheduled at once.
    e.submit(4, &prompt(4, 10), 1).unwrap();
    run_to_end(&mut e);
    let c4 = e.counters();
    assert_eq!(
        (c4.finished, c4.queue_time_us, c4.decode_time_us),
        (3, c.queue_time_us, c.decode_time_us)
    );
    assert_eq!(c4.request_generation_tokens, 6);
}

#[test]
fn kv_events_record_what_the_cache_stores_evicts_and_clears() {
    let cfg = EngineConfig {
        block_size: 16,
        kv_capacity_blocks: 12,
        max_model_len: 192,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(cfg).unwrap();
    e.record_kv_events(true);
    let p = prompt(1, 100); // 6 full blocks
    e.submit(1, &p, 2).unwrap();
    run_to_end(&mut e);
    let mut ev = Vec::new();
    e.drain_kv_events(&mut ev);
    let hashes = block_hashes(&p, 16);
    assert_eq!(ev.len(), 6);
    for (i, event) in ev.iter().enumerate() {
        assert_eq!(
            *event,
            BlockEvent::Stored {
                hash: hashes[i],
                parent: i.checked_sub(1).map(|j| hashes[j]),
                tokens: p[i * 16..(i + 1) * 16].to_vec(),
            }
        );
    }
    // Another prompt needing the whole pool evicts the first one's blocks, tail first.
    let q = prompt(2, 150);
    e.submit(2, &q, 2).unwrap();
    run_to_end(&mut e);
    ev.clear();
    e.drain_kv_events(&mut ev);
    let removed: Vec<u64> = ev
        .iter()
        .filter_map(|x| match x {
            BlockEvent::Removed { hash } => Some(*hash),
            _ => None,
        })
        .collect();
    assert!(!removed.is_empty());
    assert_eq!(removed[0], hashes[5], "the tail goes first");
    // Priming stores (no request), a reset clears.
    e.prime(&prompt(3, 32));
    assert!(e.reset_prefix_cache());
    ev.clear();
    e.drain_kv_events(&mut ev);
    assert!(matches!(ev[0], BlockEvent::Stored { parent: None, .. }));
    assert_eq!(ev.last(), Some(&BlockEvent::Cleared));
    // Off: nothing is recorded.
    e.record_kv_events(false);
    e.prime(&p);
    ev.clear();
    e.drain_kv_events(&mut ev);
    assert!(ev.is_empty());
}
