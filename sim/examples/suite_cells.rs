use kvroute_sim::suite::*;
fn main() {
    let w: Vec<Workload> = WORKLOADS.iter().copied().filter(|w| std::env::args().skip(1).any(|a| a == w.name)).collect();
    let cfg = SuiteConfig { workloads: w, seeds: (1..=8).collect(), strategies: vec!["least-request".parse().unwrap(), "prefix-cache".parse().unwrap(), "least-ttft".parse().unwrap()], engine: Default::default(), router: Default::default(), threads: 2 };
    for c in run_suite(&cfg).unwrap() {
        println!("{} seed {} {:14} slo {:3}/{} p95 {:.2} p50 {:.2} split {:?}", c.workload, c.seed, c.strategy, c.summary.within_slo, c.summary.planned, c.summary.ttft_p95_s.unwrap_or(0.0), c.ttft_p50_s.unwrap_or(0.0), c.summary.split.iter().map(|x| x.1).collect::<Vec<_>>());
    }
}
