//! Discovered pods taking real traffic through a real Envoy (`#[ignore]`d: `make test-e2e`).

use super::*;

/// One request through Envoy: when it started and ended, its status, the replica that served it.
struct Sent {
    start: Instant,
    status: u16,
    replica: String,
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn discovered_pods_take_traffic_through_envoy() {
    let api = FakeApi::start();
    let dir = TempDir::new("disc-envoy");
    let a = Sim::start(&dir, "replica-a", 5.0);
    let b = Sim::start(&dir, "replica-b", 5.0);
    let pod = |s: &Sim| {
        let port = s.addr.rsplit(':').next().unwrap().to_owned();
        VllmPod::aibrix(&s.name, "study", "127.0.0.1").label("model.aibrix.ai/port", &port)
    };
    api.add_pod(&pod(&a));
    let kv = Kv::start(&api, "disc-envoy-kv", AIBRIX);
    kv.wait_pods("study", 1, 0);
    let envoy = Envoy::start(&dir, &kv.config, &kv.ext.grpc, true);

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::<Sent>::new()));
    let current = Arc::new(Mutex::new(vec![Instant::now(); 3]));
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (stop, sent, current) = (stop.clone(), sent.clone(), current.clone());
            let listen = envoy.listen.clone();
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let body = completion("study", &prompt(&format!("w{w}"), i, 300), 8, false);
                    let start = Instant::now();
                    current.lock().unwrap()[w] = start;
                    let r = try_http(&listen, "POST", "/v1/completions", &[], &body);
                    let (status, replica) = match r {
                        Ok(r) => {
                            let replica =
                                r.header("x-kvroute-sim-replica").unwrap_or("").to_owned();
                            (r.status, replica)
                        }
                        Err(_) => (0, String::new()),
                    };
                    sent.lock().unwrap().push(Sent {
                        start,
                        status,
                        replica,
                    });
                }
            })
        })
        .collect();
    let count = |f: &dyn Fn(&Sent) -> bool| sent.lock().unwrap().iter().filter(|s| f(s)).count();

    std::thread::sleep(Duration::from_millis(800));
    let t_b = Instant::now();
    api.add_pod(&pod(&b));
    let b_seen = wait_for(Duration::from_secs(5), || {
        (count(&|s| s.replica == "replica-b") > 0).then(|| t_b.elapsed())
    })
    .expect("replica-b never got a request");
    println!("replica-b took its first request {b_seen:?} after its pod was added");
    std::thread::sleep(Duration::from_millis(800));

    let t_del = Instant::now();
    api.delete_pod("default", "replica-a");
    kv.wait_pods("study", 1, 0);
    let t_seen = Instant::now();
    println!("replica-a's deletion applied {:?} after it", t_seen - t_del);
    // Every request that started before then has ended: stop replica-a, so any request
    // still sent to it would fail.
    wait_for(Duration::from_secs(10), || {
        current
            .lock()
            .unwrap()
            .iter()
            .all(|s| *s > t_seen)
            .then_some(())
    })
    .expect("requests in flight never ended");
    let mut a = a;
    a.proc.kill();
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }

    let all = sent.lock().unwrap();
    let phase1: Vec<&Sent> = all.iter().filter(|s| s.start < t_b).collect();
    let on_a_late = all
        .iter()
        .filter(|s| s.start > t_del && s.start < t_seen && s.replica == "replica-a")
        .count();
    let after: Vec<&Sent> = all.iter().filter(|s| s.start > t_seen).collect();
    let errors: Vec<u16> = all
        .iter()
        .filter(|s| s.status != 200)
        .map(|s| s.status)
        .collect();
    println!(
        "{} requests: {} before replica-b, {} after replica-a's deletion was applied ({} sent to replica-a between its deletion and then), errors {errors:?}",
        all.len(),
        phase1.len(),
        after.len(),
        on_a_late
    );
    assert!(phase1.len() >= 5 && phase1.iter().all(|s| s.replica == "replica-a"));
    assert!(all
        .iter()
        .any(|s| s.start > t_b && s.start < t_del && s.replica == "replica-b"));
    assert!(after.len() >= 5 && after.iter().all(|s| s.replica == "replica-b"));
    assert!(errors.is_empty(), "client errors: {errors:?}");
    kv.wait("in flight back to 0", || kv.tickets_open() == 0);
    let m = kv.metrics();
    assert_eq!(metric_sum(&m, "kvroute_pod_in_flight{"), 0, "{m}");
    assert_eq!(
        metric_sum(&m, "kvroute_ticket_release_errors_total "),
        0,
        "{m}"
    );
}
