//! Pods as they come and go: added, unready or terminating, deleted with a request in flight,
//! rescheduled to a new address, data-parallel engines, same names in two namespaces.

use super::*;

#[test]
fn an_added_pod_is_routable_within_a_second() {
    let api = FakeApi::start();
    let kv = Kv::start(&api, "added", AIBRIX);
    kv.wait("/readyz 200", || kv.readyz() == 200);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    assert_eq!(grpc.route("llama"), Err(400), "a model no pod serves");
    kv.wait("the watch open", || api.open_watches() == 1);
    let lists = api.list_calls();
    let t0 = Instant::now();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    let took = grpc.until("llama", "10.0.0.1:8000", Duration::from_secs(2));
    let took = took
        .map(|_| t0.elapsed())
        .expect("never routed to the added pod");
    println!("added pod routable after {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(api.list_calls(), lists, "arrived by a list, not the watch");
    assert_eq!(kv.pods("llama", "ready"), 1);
    assert!(kv.log().contains("discovery: pod added"));

    // The port label; a pod that has no IP yet has no endpoint until it gets one.
    let pending = VllmPod {
        ip: None,
        phase: "Pending".into(),
        ready: false,
        ..VllmPod::aibrix("vllm-1", "qwen", "10.0.0.2").label("model.aibrix.ai/port", "8080")
    };
    api.add_pod(&pending);
    api.add_pod(&VllmPod::aibrix("marker", "marker", "10.0.0.3"));
    kv.wait_pods("marker", 1, 0);
    assert_eq!(
        grpc.route("qwen"),
        Err(400),
        "a pod without an IP is not a pod yet"
    );
    let t0 = Instant::now();
    let scheduled = VllmPod {
        ip: Some("10.0.0.2".into()),
        phase: "Running".into(),
        ready: true,
        ..pending
    };
    api.modify_pod(&scheduled);
    let took = grpc.until("qwen", "10.0.0.2:8080", Duration::from_secs(2));
    println!(
        "scheduled pod routable after {:?}",
        took.map(|_| t0.elapsed())
    );
    assert!(took.is_some());
}

#[test]
fn a_labelled_data_parallel_pod_is_routed_engine_by_engine() {
    let api = FakeApi::start();
    let kv = Kv::start(&api, "data-parallel", AIBRIX);
    kv.wait("/readyz 200", || kv.readyz() == 200);
    let dp =
        VllmPod::aibrix("vllm-0", "llama", "10.0.0.1").label("kvroute.io/data-parallel-size", "2");
    api.add_pod(&dp);
    kv.wait_pods("llama", 1, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let routed = |kv: &Kv, pod: &str| {
        metric_sum(
            &kv.metrics(),
            &format!("kvroute_pod_routed_total{{pod=\"{pod}\",address=\"10.0.0.1:8000\"}}"),
        )
    };
    // Random over the two engines of the one pod, both at its address.
    assert_eq!(grpc.spread(&["llama"], 40).get("10.0.0.1:8000"), Some(&40));
    let (a, b) = (
        routed(&kv, "default/vllm-0/dp0"),
        routed(&kv, "default/vllm-0/dp1"),
    );
    assert!(
        a > 0 && b > 0 && a + b == 40,
        "{a} + {b}:\n{}",
        kv.metrics()
    );
    // The label gone: one engine again, under the pod's own name.
    api.modify_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    kv.wait("the engines replaced by the pod", || {
        let m = kv.metrics();
        m.contains("kvroute_pod_in_flight{pod=\"default/vllm-0\"")
            && !m.contains("kvroute_pod_in_flight{pod=\"default/vllm-0/dp")
    });
    grpc.spread(&["llama"], 4);
    assert_eq!(routed(&kv, "default/vllm-0"), 4);
}

#[test]
fn an_unready_or_terminating_pod_gets_no_new_request() {
    let api = FakeApi::start();
    let zero = VllmPod::aibrix("vllm-0", "llama", "10.0.0.1");
    let one = VllmPod::aibrix("vllm-1", "llama", "10.0.0.2");
    api.add_pod(&zero);
    api.add_pod(&one);
    let kv = Kv::start(&api, "unready", AIBRIX);
    kv.wait_pods("llama", 2, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let both = grpc.spread(&["llama"], 40);
    assert_eq!(both.len(), 2, "both pods get requests: {both:?}");

    api.modify_pod(&VllmPod {
        ready: false,
        ..one.clone()
    });
    let took = kv.wait_pods("llama", 1, 1);
    let after = grpc.spread(&["llama"], 20);
    println!("Ready=False seen in {took:?}; 20 requests: {after:?}");
    assert_eq!(after, BTreeMap::from([("10.0.0.1:8000".to_owned(), 20)]));
    assert!(kv.log().contains("discovery: pod readiness changed"));

    api.modify_pod(&one);
    kv.wait_pods("llama", 2, 0);
    assert_eq!(grpc.spread(&["llama"], 40).len(), 2);

    // Terminating (deletionTimestamp set), still Ready: no new request either.
    api.modify_pod(&VllmPod {
        deleting: true,
        ..one.clone()
    });
    kv.wait_pods("llama", 1, 1);
    let after = grpc.spread(&["llama"], 20);
    println!("terminating: 20 requests: {after:?}");
    assert_eq!(after, BTreeMap::from([("10.0.0.1:8000".to_owned(), 20)]));
}

#[test]
fn a_deleted_pod_releases_its_request_in_flight_once() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    let kv = Kv::start(&api, "deleted", AIBRIX);
    kv.wait_pods("llama", 1, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let (open, d) = grpc.open("llama");
    assert_eq!(d.as_deref(), Ok("10.0.0.1:8000"));
    assert_eq!(kv.ext.in_flight(), 1);

    api.delete_pod("default", "vllm-0");
    let took = kv.wait_pods("llama", 0, 0);
    println!("deletion seen in {took:?}");
    let log = kv.log();
    let removed = log.lines().find(|l| l.contains("discovery: pod removed"));
    assert!(removed.is_some_and(|l| l.contains("in_flight=1")), "{log}");
    assert_eq!(grpc.route("llama"), Err(503), "a known model without pods");
    let m = kv.metrics();
    assert_eq!(metric_sum(&m, "kvroute_tickets_open "), 1, "{m}");
    assert_eq!(metric_sum(&m, "kvroute_tickets_orphaned_total "), 0, "{m}");

    grpc.close(open);
    kv.wait("the orphan released", || kv.tickets_open() == 0);
    std::thread::sleep(Duration::from_millis(300));
    let m = kv.metrics();
    assert_eq!(metric_sum(&m, "kvroute_tickets_orphaned_total "), 1, "{m}");
    assert_eq!(
        metric_sum(&m, "kvroute_ticket_release_errors_total "),
        0,
        "{m}"
    );
    assert_eq!(metric_sum(&m, "kvroute_tickets_rejected_total "), 0, "{m}");
    assert_eq!(metric_sum(&m, "kvroute_pod_in_flight{"), 0, "{m}");
}

#[test]
fn a_rescheduled_pod_is_routed_to_its_new_address() {
    let api = FakeApi::start();
    let pod = VllmPod::aibrix("vllm-0", "llama", "127.0.0.2");
    api.add_pod(&pod);
    let kv = Kv::start(&api, "resched", AIBRIX);
    kv.wait_pods("llama", 1, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    assert_eq!(grpc.route("llama").as_deref(), Ok("127.0.0.2:8000"));
    kv.wait("the probe released", || kv.tickets_open() == 0);

    // A StatefulSet reschedule: deleted, recreated Pending without an IP, then Running.
    let t0 = Instant::now();
    api.delete_pod("default", "vllm-0");
    let again = VllmPod {
        ip: None,
        phase: "Pending".into(),
        ready: false,
        ..pod.clone()
    };
    api.add_pod(&again);
    api.modify_pod(&VllmPod {
        ip: Some("127.0.0.3".into()),
        ..pod.clone()
    });
    let took = grpc.until("llama", "127.0.0.3:8000", Duration::from_secs(2));
    println!(
        "rescheduled pod routed to its new IP after {:?}",
        took.map(|_| t0.elapsed())
    );
    assert!(took.is_some(), "{}", kv.log());
    let spread = grpc.spread(&["llama"], 10);
    assert_eq!(spread, BTreeMap::from([("127.0.0.3:8000".to_owned(), 10)]));

    // The IP changing in place keeps the pod and its request in flight. (A probe above may
    // have been routed to the old pod just before its deletion was seen: an orphan.)
    kv.wait("the probes released", || kv.tickets_open() == 0);
    let orphans = metric_sum(&kv.metrics(), "kvroute_tickets_orphaned_total ");
    let (open, d) = grpc.open("llama");
    assert_eq!(d.as_deref(), Ok("127.0.0.3:8000"));
    api.modify_pod(&VllmPod {
        ip: Some("127.0.0.4".into()),
        ..pod.clone()
    });
    let took = grpc.until("llama", "127.0.0.4:8000", Duration::from_secs(2));
    println!("in-place address change routed after {took:?}");
    assert!(took.is_some());
    assert!(kv.log().contains("discovery: pod address changed"));
    // The probes' stream ends are asynchronous: wait for them, then only ours is left.
    kv.wait("the request in flight kept", || kv.ext.in_flight() == 1);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(kv.ext.in_flight(), 1, "the request in flight was dropped");
    grpc.close(open);
    kv.wait("released", || kv.ext.in_flight() == 0);
    let m = kv.metrics();
    let log = kv.log();
    let now = metric_sum(&m, "kvroute_tickets_orphaned_total ");
    assert_eq!(now, orphans, "orphaned by an address change: {m}\n{log}");
    assert_eq!(
        metric_sum(&m, "kvroute_ticket_release_errors_total "),
        0,
        "{m}"
    );
}

#[test]
fn same_named_pods_of_two_namespaces_are_two_pods() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1").ns("a"));
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.2").ns("b"));
    let kv = Kv::start(
        &api,
        "same-name",
        &format!("{AIBRIX}\nnamespaces = [\"a\", \"b\"]"),
    );
    kv.wait_pods("llama", 2, 0);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let spread = grpc.spread(&["llama"], 40);
    assert_eq!(spread.len(), 2, "2 pods listed, routed to: {spread:?}");
    api.delete_pod("a", "vllm-0");
    kv.wait_pods("llama", 1, 0);
    grpc.until_spread(&["llama"], &["10.0.0.2:8000"]);
}
