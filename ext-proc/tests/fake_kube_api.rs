//! The in-test Kubernetes API server (support::k8s) answers as a real one does: pages and
//! continue tokens, Status errors for bad input, 410 Expired, live watches with bookmarks.
//! The discovery tests (`tests/discovery/`) rely on it.

mod support;

use std::time::Duration;

use support::k8s::{FakeApi, VllmPod};
use support::*;

#[test]
fn the_fake_api_server_answers_as_one_does() {
    use k8s_openapi::api::core::v1::Pod;
    let api = FakeApi::start();
    api.add_pod(&VllmPod::aibrix("vllm-0", "llama", "10.0.0.1"));
    api.add_pod(&VllmPod::aibrix("vllm-1", "llama", "10.0.0.2").ns("b"));
    api.add_pod(&VllmPod::new("other", Some("10.0.0.3")));
    let addr = api.url.trim_start_matches("http://").to_owned();
    let get = |path: &str| http(&addr, "GET", path, &[], b"");
    let query = "/api/v1/pods?labelSelector=model.aibrix.ai%2Fname%3Dllama&limit=1";
    let first = get(query).json();
    assert_eq!(
        (first["kind"].as_str(), first["apiVersion"].as_str()),
        (Some("PodList"), Some("v1"))
    );
    let token = first["metadata"]["continue"]
        .as_str()
        .expect("a continue token")
        .to_owned();
    let second = get(&format!("{query}&continue={token}")).json();
    assert_eq!(
        second["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    assert!(second["metadata"]["continue"].is_null(), "{second}");
    let pods: Vec<Pod> = [&first, &second]
        .iter()
        .flat_map(|l| serde_json::from_value::<Vec<Pod>>(l["items"].clone()).unwrap())
        .collect();
    let names: Vec<_> = pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["vllm-1", "vllm-0"]); // by namespace, then name
    assert!(pods
        .iter()
        .all(|p| p.metadata.uid.is_some() && p.metadata.resource_version.is_some()));

    for (path, code) in [
        ("/api/v1/nodes", 404),
        ("/api/v1/pods?labelSelector=app%20in%20(a)", 400),
        ("/api/v1/pods?labelSelector=%3Dx", 400),
        ("/api/v1/pods?fieldSelector=spec.nodeName%3Dn", 400),
        ("/api/v1/pods?limit=ten", 400),
        ("/api/v1/pods?continue=nonsense", 400),
        ("/api/v1/pods?x=%zz", 400),
        ("/api/v1/pods?watch=true&resourceVersion=abc", 400),
    ] {
        let r = get(path);
        let (s, j) = (r.status, r.json());
        assert_eq!(
            (s, j["kind"].as_str(), j["code"].as_u64()),
            (code, Some("Status"), Some(code.into())),
            "{path}"
        );
    }
    assert_eq!(http(&addr, "POST", "/api/v1/pods", &[], b"{}").status, 405);

    // Injected list failures: one namespace's (before the global ones), then any list's.
    api.fail_lists_in("b", 1);
    api.fail_lists(1);
    let lists = [
        "/api/v1/namespaces/default/pods",
        "/api/v1/namespaces/b/pods",
    ];
    let status = |path: &str| {
        let r = get(path);
        (r.status, r.json()["kind"].as_str().map(str::to_owned))
    };
    let failed = (500, Some("Status".to_owned()));
    let listed = |kind: &str| (200, Some(kind.to_owned()));
    assert_eq!(status(lists[1]), failed, "b's failure");
    assert_eq!(status(lists[1]), failed, "the global failure");
    assert_eq!(status(lists[1]), listed("PodList"));
    api.fail_lists_in("b", 2);
    assert_eq!(status(lists[0]), listed("PodList"), "another namespace");
    assert_eq!(status("/api/v1/pods"), listed("PodList"), "every namespace");
    assert_eq!(status(lists[1]), failed);
    api.fail_lists_in("b", 0);
    assert_eq!(status(lists[1]), listed("PodList"));

    // After a compaction: an old continue token is 410, a watch from an old RV one ERROR event.
    api.compact();
    let r = get(&format!("{query}&continue={token}"));
    assert_eq!(
        (r.status, r.json()["reason"].as_str()),
        (410, Some("Expired"))
    );
    let r = get("/api/v1/pods?watch=true&resourceVersion=1&timeoutSeconds=5");
    let lines: Vec<serde_json::Value> = r
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (
            lines[0]["type"].as_str(),
            lines[0]["object"]["code"].as_u64()
        ),
        (Some("ERROR"), Some(410))
    );
    assert_eq!(lines[0]["object"]["reason"], "Expired");

    // A live watch of one namespace: the changes after its RV, a bookmark, closed on time.
    let rv = get("/api/v1/pods").json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let watched = std::thread::scope(|s| {
        let w = s.spawn(|| get(&format!("/api/v1/namespaces/default/pods?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2&labelSelector=model.aibrix.ai%2Fname")));
        std::thread::sleep(Duration::from_millis(300));
        api.delete_pod("b", "vllm-1");
        api.delete_pod("default", "vllm-0");
        api.delete_pod("default", "other");
        w.join().unwrap()
    });
    let events: Vec<serde_json::Value> = watched
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"DELETED"), "{events:?}");
    assert_eq!(events[0]["object"]["metadata"]["name"], "vllm-0");
    assert!(
        types[1..].iter().all(|t| *t == "BOOKMARK") && types.len() >= 2,
        "{types:?}"
    );
}
