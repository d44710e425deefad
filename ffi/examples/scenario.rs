//! Runs `tests/c/scenario.txt` through kvroute-core directly and prints one line per step: the
//! expected output of `tests/c/scenario.c`, which runs the same file through the C API.
//! `make test-c` diffs the two, so the decisions (pods, tickets, reasons, matches and the
//! one-line explanations) through the C ABI equal the core's with the same seed.
//!
//! Run: `cargo run -p kvroute-ffi --example scenario -- tests/c/scenario.txt`

use kvroute::kvroute_status;
use kvroute_core::{
    Completion, EngineSnapshot, Outcome, PodSpec, RouteRequest, Router, RouterConfig, StrategySpec,
    Ticket, Timestamp, Timings,
};

const SENTENCE: &str =
    "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n";

/// 256 hex digits derived from the family number (the same generator as scenario.c).
fn salt(family: u64) -> String {
    let mut x = family.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..256)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(b"0123456789abcdef"[(x >> 60) as usize])
        })
        .collect()
}

fn system_text(family: u64) -> String {
    format!(
        "{}\nDocument {family}\n{}",
        salt(family),
        SENTENCE.repeat(300)
    )
}

fn user_text(q: u64) -> String {
    format!("Question {q:06}: Explain the operational tradeoffs in detail.")
}

fn outcome(n: &str) -> Outcome {
    Outcome::ALL[n.parse::<usize>().expect("outcome number")]
}

fn main() {
    let path = std::env::args().nth(1).expect("usage: scenario FILE");
    let text = std::fs::read_to_string(&path).expect("read scenario");
    let mut lines = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'));
    let head: Vec<&str> = lines
        .next()
        .expect("config line")
        .split_whitespace()
        .collect();
    assert_eq!(head[0], "config");
    let config = RouterConfig {
        seed: head[1].parse().expect("seed"),
        default_strategy: StrategySpec::parse(head[2]).expect("strategy"),
        ..Default::default()
    };
    let mut router = Router::new(config).expect("valid config");
    let mut tickets: Vec<Option<Ticket>> = Vec::new();
    for line in lines {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| w[i].parse::<u64>().expect("number");
        match w[0] {
            "pod" => {
                let spec = PodSpec {
                    name: w[2],
                    address: w[3],
                    ready: w[4] == "1",
                };
                match router.add_pod(w[1], spec) {
                    Ok(id) => println!("pod {} -> {}", w[2], id.as_u32()),
                    Err(e) => println!("pod {} {}", w[2], kvroute_status::from(e).as_str()),
                }
            }
            "ready" => {
                let id = router.pod_id(w[1]).expect("known pod");
                router.set_pod_ready(id, w[2] == "1").expect("live pod");
                println!("ready {} {}", w[1], w[2]);
            }
            "remove" => {
                let id = router.pod_id(w[1]).expect("known pod");
                router.remove_pod(id).expect("live pod");
                println!("remove {}", w[1]);
            }
            "route" | "chat" => {
                let (now, model, strategy, family, q) = if w[0] == "route" {
                    (num(1), w[2], w[3], num(4), num(5))
                } else {
                    (num(1), "study", w[2], num(3), num(4))
                };
                let sep = if w[0] == "chat" { " " } else { "" };
                let prompt = format!("{}{sep}{}", system_text(family), user_text(q));
                let n = tickets.len();
                let spec = match strategy {
                    "-" => None,
                    s => match StrategySpec::parse(s) {
                        Ok(spec) => Some(spec),
                        Err(e) => {
                            println!("route #{n} {}", kvroute_status::from(e).as_str());
                            tickets.push(None);
                            continue;
                        }
                    },
                };
                let hashes = router.hash_config().hashes(prompt.as_bytes());
                let mut req = RouteRequest::new(model, &hashes);
                if let Some(spec) = &spec {
                    req = req.with_strategy(spec);
                }
                match router.route(req, Timestamp::from_millis(now)) {
                    Ok(d) => {
                        println!(
                            "route #{n} ticket={} pod={} reason={} match={} blocks={}/{} imbalance={} | {d}",
                            d.ticket.as_u64(),
                            d.pod.as_u32(),
                            d.reason.as_str(),
                            d.match_percent,
                            d.matched_blocks,
                            d.total_blocks,
                            u8::from(d.imbalance),
                        );
                        tickets.push(Some(d.ticket));
                    }
                    Err(e) => {
                        println!("route #{n} {}", kvroute_status::from(e).as_str());
                        tickets.push(None);
                    }
                }
            }
            "complete" | "ticket" => {
                let ticket = if w[0] == "complete" {
                    tickets[num(2) as usize].expect("routed")
                } else {
                    Ticket::from_u64(num(2))
                };
                let r = router.complete(
                    ticket,
                    Completion::new(outcome(w[3])),
                    Timestamp::from_millis(num(1)),
                );
                match r {
                    Ok(released) => match kvroute::kvroute_health_event::from(released.health) {
                        kvroute::kvroute_health_event::None => {
                            println!("{} {} {}", w[0], w[2], kvroute_status::Ok.as_str())
                        }
                        event => println!(
                            "{} {} {} health={}",
                            w[0],
                            w[2],
                            kvroute_status::Ok.as_str(),
                            event.as_str()
                        ),
                    },
                    Err(e) => println!("{} {} {}", w[0], w[2], kvroute_status::from(e).as_str()),
                }
            }
            "tick" => {
                router.handle_timeout(Timestamp::from_millis(num(1)));
                match router.poll_timeout() {
                    Some(t) => println!("tick {} deadline={}", w[1], t.as_millis()),
                    None => println!("tick {} deadline=none", w[1]),
                }
            }
            "done" => {
                let ticket = tickets[num(2) as usize].expect("routed");
                let timings = Timings {
                    first_token_ms: Some(num(3)),
                    total_ms: Some(num(4)),
                    output_tokens: Some(num(5) as u32),
                    cached_tokens: Some(num(6) as u32),
                    prompt_tokens: Some(num(7) as u32),
                };
                let completion = Completion {
                    outcome: Outcome::Success,
                    timings,
                };
                let r = router.complete(ticket, completion, Timestamp::from_millis(num(1)));
                let st = r.map_or_else(kvroute_status::from, |_| kvroute_status::Ok);
                println!("done {} {}", w[2], st.as_str());
            }
            "engine" => {
                let id = router.pod_id(w[2]).expect("known pod");
                let snapshot = EngineSnapshot {
                    running: num(3) as u32,
                    waiting: num(4) as u32,
                    kv_usage: Some(num(5) as f64 / 100.0),
                    ..EngineSnapshot::default()
                };
                router
                    .observe_engine(id, snapshot, Timestamp::from_millis(num(1)))
                    .expect("live pod");
                println!("engine {}", w[2]);
            }
            "capacity" => {
                let id = router.pod_id(w[1]).expect("known pod");
                router
                    .set_pod_capacity(id, num(2) as u32)
                    .expect("live pod");
                println!("capacity {} {}", w[1], w[2]);
            }
            "check" => {
                let id = router.pod_id(w[2]).expect("known pod");
                let event = router
                    .report_health_check(id, w[3] == "1", Timestamp::from_millis(num(1)))
                    .expect("live pod");
                println!(
                    "check {} {} {}",
                    w[2],
                    w[3],
                    kvroute::kvroute_health_event::from(event).as_str()
                );
            }
            "health" => {
                let id = router.pod_id(w[1]).expect("known pod");
                let h = router.pod(id).expect("live pod").health;
                // In `kvroute_core::EjectionReason::ALL` order.
                let [consecutive_5xx, gateway] = h.ejections;
                println!(
                    "health {} ejected={} probing={} until={} checks_failing={} ejections={}/{}",
                    w[1],
                    u8::from(h.ejected),
                    u8::from(h.probing),
                    h.ejected_until.map_or(0, Timestamp::as_millis),
                    u8::from(h.checks_failing),
                    consecutive_5xx,
                    gateway,
                );
            }
            other => panic!("unknown command {other:?}"),
        }
    }
    let s = kvroute::kvroute_stats::from(&router.stats());
    println!(
        "stats pods={} ready={} models={} in_flight={} open={} issued={} ok={} cancelled={} failed={} connect_failed={} reset={} timeout={} expired={} orphaned={} rejected={} blocks={} unknown_model={} no_ready={} imbalance={} reasons={:?} buckets={:?}",
        s.pods,
        s.ready_pods,
        s.models,
        s.in_flight,
        s.tickets_open,
        s.tickets_issued,
        s.completed_success,
        s.completed_cancelled,
        s.completed_failed,
        s.completed_connect_failed,
        s.completed_reset,
        s.completed_timeout,
        s.tickets_expired,
        s.tickets_orphaned,
        s.tickets_rejected,
        s.index_blocks,
        s.unknown_model,
        s.no_ready_pod,
        s.imbalance_events,
        &s.routed_by_reason[..kvroute::kvroute_reason::ALL.len()],
        s.decisions_by_match_bucket,
    );
}
