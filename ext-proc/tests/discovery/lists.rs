//! Lists and watches: readiness until every watched namespace has listed once, watches that
//! resume or relist without losing a pod.

use super::*;

#[test]
fn readyz_is_503_until_the_first_complete_list() {
    let api = FakeApi::start();
    let ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
    for (i, ip) in ips.iter().enumerate() {
        let ns = ["a", "b", "c"][i];
        api.add_pod(&VllmPod::aibrix(&format!("vllm-{i}"), "llama", ip).ns(ns));
    }
    // A pod without the model label is not selected.
    api.add_pod(&VllmPod::new("other", Some("10.0.0.9")));
    // Every list fails until the test lets them succeed: nothing is listed before then.
    api.fail_lists(u32::MAX);
    api.set_page_size(1); // three pages: the continue tokens are followed
    let kv = Kv::start(&api, "readyz", AIBRIX);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    // After the first failed list and after its retry (kube backs off from 0.8 s), /readyz
    // says not ready, and a request for the model is refused as for a model no pod serves
    // (README, Discovery: 400 `model_not_found` until one of its pods has been seen).
    for failures in 1..=2 {
        kv.assert_not_ready_after(&api, failures, "ready before any list succeeded");
        grpc.assert_model_not_found("llama");
    }
    // Lists succeed from now on: ready at the next retry, and the three pods take requests.
    api.fail_lists(0);
    let waited = kv.wait_secs("/readyz 200", 10, || kv.readyz() == 200);
    let m = kv.metrics();
    let failed = metric_sum(&m, "kvroute_discovery_errors_total ");
    println!(
        "ready {waited:?} after lists were let succeed; {failed} failed lists; list calls {}",
        api.list_calls()
    );
    assert!(failed >= 2, "{m}");
    assert_eq!(kv.pods("llama", "ready"), 3, "{m}");
    let want: Vec<String> = ips.iter().map(|ip| format!("{ip}:8000")).collect();
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    grpc.until_spread(&["llama"], &want);
    // Each failed list was one call counted once; then one list of three one-item pages.
    // Every namespace (/api/v1/pods).
    assert_eq!(api.list_calls(), failed + 3, "{m}");
    let lists: Vec<String> = (api.requests().into_iter())
        .filter(|r| !r.contains("watch=true"))
        .collect();
    assert!(
        lists.iter().all(|r| r.starts_with("/api/v1/pods?")
            && r.contains("labelSelector=model.aibrix.ai%2Fname")),
        "{lists:?}"
    );
    let firsts = lists.iter().filter(|r| !r.contains("continue=")).count();
    assert_eq!(firsts as u64, failed + 1, "{lists:?}");
    assert_eq!(lists.iter().filter(|r| r.contains("continue=")).count(), 2);
    assert!(kv.log().contains("discovery: first list complete"));
}

#[test]
fn a_dropped_watch_resumes_without_a_relist() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    let kv = Kv::start(&api, "resume", AIBRIX);
    kv.wait_pods("llama", 1, 0);
    kv.wait("the watch open", || api.open_watches() == 1);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let (lists, watches, errors) = (api.list_calls(), api.watch_calls(), kv.errors());

    for round in 1..=2 {
        api.drop_watches();
        // Most likely before the client has even seen the cut: replayed from its RV.
        let t0 = Instant::now();
        let name = format!("vllm-{round}");
        let ip = format!("10.0.0.{}", round + 1);
        api.add_pod(&VllmPod::aibrix(&name, &name, &ip));
        let took = grpc.until(&name, &format!("{ip}:8000"), Duration::from_secs(3));
        let took = took
            .map(|_| t0.elapsed())
            .expect("the pod added across the cut");
        println!("round {round}: pod added across a dropped watch routable after {took:?}");
    }
    let resumed: Vec<String> = (api.requests().into_iter())
        .filter(|r| r.contains("watch=true"))
        .collect();
    println!(
        "list calls {} -> {}, watch calls {watches} -> {}, errors {errors} -> {}",
        lists,
        api.list_calls(),
        api.watch_calls(),
        kv.errors()
    );
    assert!(api.watch_calls() >= watches + 2, "{resumed:?}");
    assert_eq!(
        api.list_calls(),
        lists,
        "the watcher listed again: {resumed:?}"
    );
    assert!(resumed.iter().all(|r| !r.contains("resourceVersion=0&")));
    assert_eq!(kv.errors(), errors, "a clean resume counts no error");
    assert_eq!(kv.pods("llama", "ready"), 1);
}

#[test]
fn a_410_relist_loses_no_pod() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-a", "llama", "10.0.0.1"));
    api.add_pod(&VllmPod::aibrix("vllm-b", "llama", "10.0.0.2"));
    let kv = Kv::start(&api, "gone", AIBRIX);
    kv.wait_pods("llama", 2, 0);
    kv.wait("the watch open", || api.open_watches() == 1);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    let (lists, errors) = (api.list_calls(), kv.errors());

    api.compact();
    api.drop_watches();
    let t0 = Instant::now();
    // While the client resumes (and gets 410 Expired), one pod goes and one comes.
    api.delete_pod("default", "vllm-a");
    api.add_pod(&VllmPod::aibrix("vllm-c", "llama", "10.0.0.3"));
    let took = grpc.until_spread(&["llama"], &["10.0.0.2:8000", "10.0.0.3:8000"]);
    println!(
        "relisted after 410 in {:?} (routes settled {took:?} after the loop began); list calls {lists} -> {}, errors {errors} -> {}",
        t0.elapsed(),
        api.list_calls(),
        kv.errors()
    );
    assert!(api.list_calls() > lists, "no relist");
    assert!(kv.errors() > errors, "the 410 was not counted");
    kv.wait_pods("llama", 2, 0);
    let log = kv.log();
    assert!(
        log.lines()
            .any(|l| l.contains("discovery: pod removed") && l.contains("vllm-a")),
        "{log}"
    );
    let expired = api
        .requests()
        .into_iter()
        .filter(|r| r.contains("watch=true"));
    assert!(
        expired.count() >= 3,
        "initial watch, the expired one, the new one"
    );
}

#[test]
fn two_namespaces_are_watched_and_both_must_list() {
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-a", "llama", "10.0.0.1").ns("a"));
    api.add_pod(&VllmPod::aibrix("vllm-b", "llama", "10.0.0.2").ns("b"));
    // A model served in namespace b only.
    api.add_pod(&VllmPod::aibrix("qwen-b", "qwen", "10.0.0.6").ns("b"));
    api.add_pod(&VllmPod::aibrix("vllm-c", "llama", "10.0.0.3").ns("c"));
    // Namespace b's lists fail until the test lets them succeed; a's succeed.
    api.fail_lists_in("b", u32::MAX);
    let kv = Kv::start(
        &api,
        "two-ns",
        &format!("{AIBRIX}\nnamespaces = [\"a\", \"b\"]"),
    );
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    kv.wait_pods("llama", 1, 0); // namespace a listed
                                 // After b's first failed list and after its retry (kube backs off from 0.8 s): not ready
                                 // (`/readyz` waits for every watched namespace's first list). Requests are routed over the
                                 // pods seen so far (routing does not wait for readiness): llama to a's pod, and qwen, none
                                 // of whose pods has been seen, gets 400 `model_not_found` (README, Discovery).
    for failures in 1..=2 {
        kv.assert_not_ready_after(&api, failures, "ready with only namespace a listed");
        let spread = grpc.spread(&["llama"], 10);
        assert_eq!(spread, BTreeMap::from([("10.0.0.1:8000".into(), 10)]));
        grpc.assert_model_not_found("qwen");
        assert_eq!(
            (kv.pods("llama", "ready"), kv.pods("qwen", "ready")),
            (1, 0)
        );
    }
    // b's lists succeed from now on: ready at its next retry, over both namespaces' pods.
    api.fail_lists_in("b", 0);
    let took = kv.wait_secs("/readyz 200", 10, || kv.readyz() == 200);
    let failed = kv.errors();
    println!(
        "namespace b's lists failed {failed} times: ready {took:?} after they were let succeed"
    );
    assert!(failed >= 2, "{}", kv.metrics());
    kv.wait_pods("llama", 2, 0);
    kv.wait_pods("qwen", 1, 0);
    let spread = grpc.spread(&["llama"], 40);
    let keys: Vec<&str> = spread.keys().map(String::as_str).collect();
    assert_eq!(keys, ["10.0.0.1:8000", "10.0.0.2:8000"], "{spread:?}");
    assert_eq!(grpc.route("qwen"), Ok("10.0.0.6:8000".into()));
    // Each failed list was one call counted once; a listed once, b once more when let.
    let lists = |ns: &str| {
        let path = format!("/api/v1/namespaces/{ns}/pods?");
        (api.requests().iter())
            .filter(|r| r.starts_with(&path) && !r.contains("watch=true"))
            .count() as u64
    };
    assert_eq!((lists("a"), lists("b")), (1, failed + 1));
    assert_eq!(api.list_calls(), failed + 2);
    for r in api.requests() {
        assert!(
            r.starts_with("/api/v1/namespaces/a/pods?")
                || r.starts_with("/api/v1/namespaces/b/pods?"),
            "{r}"
        );
    }
    // Changes in either namespace are followed, in none other.
    api.delete_pod("a", "vllm-a");
    api.add_pod(&VllmPod::aibrix("vllm-b2", "llama", "10.0.0.4").ns("b"));
    api.add_pod(&VllmPod::aibrix("vllm-c2", "llama", "10.0.0.5").ns("c"));
    grpc.until_spread(&["llama"], &["10.0.0.2:8000", "10.0.0.4:8000"]);
    kv.wait_pods("llama", 2, 0);
}
