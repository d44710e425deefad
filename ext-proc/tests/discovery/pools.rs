//! Gateway API Inference Extension `InferencePool`s: the pods each pool selects serve its
//! models, and a pool deleted while a watch was down is noticed on the relist.

use super::*;

#[test]
fn an_inference_pool_routes_every_model_over_its_selected_pods() {
    let api = FakeApi::start();
    let kv = Kv::start(
        &api,
        "pool",
        "mode = \"inference-pool\"\npool_name = \"vllm-pool\"\npool_namespace = \"default\"",
    );
    kv.wait("/readyz 200 (no pool yet)", || kv.readyz() == 200);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    assert_eq!(
        grpc.route("whatever"),
        Err(503),
        "before any pod: 503, not 400"
    );

    let one0 = VllmPod::new("one-0", Some("10.0.1.1")).label("app", "one");
    api.add_pod(&one0);
    api.add_pod(&VllmPod::new("one-1", Some("10.0.1.2")).label("app", "one"));
    api.add_pod(&VllmPod::new("two-0", Some("10.0.2.1")).label("app", "two"));
    api.add_pod(&VllmPod::new("plain", Some("10.0.9.9")));
    let mut pool = InferencePool::new("vllm-pool", &[("app", "one")], &[8000]);
    // Another namespace's pool of the same name, and another pool: not ours.
    let mut elsewhere = InferencePool::new("vllm-pool", &[("app", "two")], &[7000]);
    elsewhere.namespace = "other".into();
    api.put_pool(&elsewhere);
    api.put_pool(&InferencePool::new(
        "other-pool",
        &[("app", "two")],
        &[7000],
    ));
    assert_eq!(grpc.route("whatever"), Err(503), "pods but no pool yet");
    let t0 = Instant::now();
    api.put_pool(&pool);
    let models = ["whatever", "llama", "qwen"];
    grpc.until_spread(&models, &["10.0.1.1:8000", "10.0.1.2:8000"]);
    println!("pool created: its pods routed after {:?}", t0.elapsed());
    kv.wait_pods("vllm-pool", 2, 0);

    let t0 = Instant::now();
    pool.match_labels = BTreeMap::from([("app".into(), "two".into())]);
    api.put_pool(&pool);
    grpc.until_spread(&models, &["10.0.2.1:8000"]);
    println!("selector app=one -> app=two followed in {:?}", t0.elapsed());
    kv.wait_pods("vllm-pool", 1, 0);

    let t0 = Instant::now();
    pool.target_ports = vec![9000];
    api.put_pool(&pool);
    grpc.until_spread(&models, &["10.0.2.1:9000"]);
    println!("target port 8000 -> 9000 followed in {:?}", t0.elapsed());
    pool.target_ports = vec![9000, 9001];
    api.put_pool(&pool);
    grpc.until_spread(&models, &["10.0.2.1:9000", "10.0.2.1:9001"]);
    kv.wait_pods("vllm-pool", 2, 0);

    // A pod relabelled into the pool joins it (the watch says ADDED), out of it leaves it.
    api.modify_pod(&one0.clone().label("app", "two"));
    grpc.until_spread(
        &models,
        &[
            "10.0.1.1:9000",
            "10.0.1.1:9001",
            "10.0.2.1:9000",
            "10.0.2.1:9001",
        ],
    );
    api.modify_pod(&one0);
    grpc.until_spread(&models, &["10.0.2.1:9000", "10.0.2.1:9001"]);

    api.delete_pool("default", "vllm-pool");
    kv.wait_pods("vllm-pool", 0, 0);
    assert_eq!(grpc.route("whatever"), Err(503), "pool deleted: 503");
    let log = kv.log();
    assert!(log.contains("discovery: InferencePool deleted"), "{log}");
    let pools: Vec<String> = (api.requests().into_iter())
        .filter(|r| r.contains("inferencepools"))
        .collect();
    assert!(
        pools.iter().all(|r| r.starts_with(
            "/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools?"
        ) && r.contains("fieldSelector=metadata.name%3Dvllm-pool")),
        "{pools:?}"
    );
}

#[test]
fn an_inference_pool_deleted_during_a_410_gap_is_noticed_on_the_relist() {
    let api = FakeApi::start();
    let kv = Kv::start(
        &api,
        "pool-gap",
        "mode = \"inference-pool\"\npool_name = \"p\"",
    );
    api.add_pod(&VllmPod::new("one-0", Some("10.0.1.1")).label("app", "one"));
    api.put_pool(&InferencePool::new("p", &[("app", "one")], &[8000]));
    kv.wait_pods("p", 1, 0);
    kv.wait("both watches open", || api.open_watches() == 2);
    let lists = api.list_calls();
    api.compact();
    api.drop_watches();
    api.delete_pool("default", "p");
    // The pool's relist (which may drop the pods' watch before it relists: the pool is gone).
    kv.wait("the pool relisted", || api.list_calls() > lists);
    let mut grpc = Grpc::connect(&kv.ext.grpc);
    kv.wait("the deleted pool's pods removed", || {
        kv.pods("p", "ready") == 0 && grpc.route("x") == Err(503)
    });
}
