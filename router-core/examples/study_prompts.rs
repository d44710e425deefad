//! Routes the study's prompt shape (8 salted families of ~28,000 characters, fresh question
//! numbers) through the core with prefix-cache and least-request, two pods, and prints where
//! every request went and why. Requests complete after a fixed simulated service time, so the
//! loads the strategies see are real in-flight counts.
//!
//! Run: `cargo run --release -p kvroute-core --example study_prompts`

use kvroute_core::{
    Completion, Outcome, PodSpec, RouteRequest, Router, RouterConfig, Strategy, StrategySpec,
    Timestamp,
};

const SENTENCE: &str = "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n";
const ARRIVAL_MS: u64 = 625; // 1.6 requests/s
const SERVICE_MS: u64 = 7_700; // the study's ~7.7 s per request at full batch

fn prompt(salt: &str, family: usize, question: u32) -> String {
    format!("{salt}\nDocument {family}\n{}Question {question:06}: Explain the operational tradeoffs in detail.", SENTENCE.repeat(300))
}

fn main() {
    let mut rng = fastrand::Rng::with_seed(102);
    let salts: Vec<String> = (0..8)
        .map(|_| {
            (0..256)
                .map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)]))
                .collect()
        })
        .collect();
    // hot50 order: family 0 is hot (48 requests), the other 7 share 48.
    let mut families: Vec<usize> = (0..48)
        .map(|_| 0)
        .chain((0..48).map(|i| 1 + i % 7))
        .collect();
    rng.shuffle(&mut families);

    for strategy in [Strategy::PrefixCache, Strategy::LeastRequest] {
        let mut router = Router::new(RouterConfig {
            seed: 102,
            ..Default::default()
        })
        .expect("valid config");
        for (name, addr) in [("vllm-a", "127.0.0.1:8001"), ("vllm-b", "127.0.0.1:8002")] {
            router
                .add_pod(
                    "study",
                    PodSpec {
                        name,
                        address: addr,
                        ready: true,
                    },
                )
                .expect("valid pod");
        }
        let spec = StrategySpec::single(strategy);
        let mut open: Vec<(u64, kvroute_core::Ticket)> = Vec::new();
        let mut per_pod = [[0u32; 8]; 2];
        let mut reasons = std::collections::BTreeMap::new();
        println!("\n== strategy {strategy} ==");
        println!(
            "{:>3} {:>6} {:>7} {:>22} {:>6} {:>9}",
            "#", "family", "pod", "reason", "match", "loads a/b"
        );
        for (i, &family) in families.iter().enumerate() {
            let now = i as u64 * ARRIVAL_MS;
            open.retain(|&(done, ticket)| {
                if done <= now {
                    router
                        .complete(
                            ticket,
                            Completion::new(Outcome::Success),
                            Timestamp::from_millis(done),
                        )
                        .expect("open ticket");
                    false
                } else {
                    true
                }
            });
            let loads: Vec<u32> = router.pods().iter().map(|p| p.in_flight).collect();
            let text = prompt(&salts[family], family, 100_000 + i as u32);
            let hashes = router.hash_config().hashes(text.as_bytes());
            let d = router
                .route(
                    RouteRequest::new("study", &hashes).with_strategy(&spec),
                    Timestamp::from_millis(now),
                )
                .expect("routable");
            let pod = usize::from(&*d.pod_name == "vllm-b");
            per_pod[pod][family] += 1;
            *reasons.entry(d.reason.as_str()).or_insert(0u32) += 1;
            open.push((now + SERVICE_MS, d.ticket));
            println!(
                "{:>3} {:>6} {:>7} {:>22} {:>5}% {:>4}/{}",
                i + 1,
                family,
                &*d.pod_name,
                d.reason.as_str(),
                d.match_percent,
                loads[0],
                loads[1]
            );
        }
        println!("\nsummary for {strategy}: requests per family on vllm-a / vllm-b");
        for (f, (on_a, on_b)) in per_pod[0].iter().zip(&per_pod[1]).enumerate() {
            let hot = if f == 0 { " (hot)" } else { "      " };
            println!("  family {f}{hot}: {on_a:>2} / {on_b:>2}");
        }
        let total: Vec<u32> = per_pod.iter().map(|p| p.iter().sum()).collect();
        println!("  total        : {:>2} / {:>2}", total[0], total[1]);
        println!("  reasons      : {reasons:?}");
        let st = router.stats();
        println!(
            "  index blocks : {}, imbalance events: {}",
            st.index.blocks, st.models[0].imbalance_events
        );
    }
}
