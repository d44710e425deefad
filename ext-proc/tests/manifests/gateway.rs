//! The gateway wiring (`envoy/gateway/`, `deploy/kubernetes/gateway/`) against the overlays it
//! sends requests to.

use super::*;

fn ingress_peer_labels(np: &NetworkPolicy) -> Vec<BTreeMap<String, String>> {
    np.spec
        .iter()
        .flat_map(|s| s.ingress.iter().flatten())
        .flat_map(|r| r.from.iter().flatten())
        .filter_map(|p| p.pod_selector.as_ref()?.match_labels.clone())
        .collect()
}

#[test]
fn gateway_wiring_matches_the_overlays() {
    let aibrix = check_overlay("aibrix");
    let pool = check_overlay("inference-pool");

    // AIBrix style: envoy/gateway/gateway.yaml's EnvoyExtensionPolicy calls kvroute's Service
    // in its namespace, with the processing modes kvroute routes with.
    let gw = docs_of("envoy/gateway/gateway.yaml");
    let policy_doc = find(&gw, "EnvoyExtensionPolicy", "kvroute-ext-proc");
    assert_eq!(
        policy_doc.ns(),
        aibrix.namespace,
        "the policy sits in kvroute's namespace"
    );
    let policy: Cr<cr::EnvoyExtensionPolicySpec> = custom(policy_doc);
    let ext = &policy.spec.ext_proc[0];
    let backend = &ext.backend_refs[0];
    assert_eq!(
        backend.name, aibrix.service,
        "extProc backend = kvroute's Service"
    );
    assert_eq!(
        backend.namespace.as_deref().unwrap_or(policy_doc.ns()),
        aibrix.namespace
    );
    assert_eq!(backend.port.map(i32::from), Some(GRPC_PORT));
    assert_eq!(
        ext.fail_open,
        Some(true),
        "failOpen: a kvroute restart must not refuse requests"
    );
    let mode = ext.processing_mode.as_ref().expect("processingMode");
    assert_eq!(
        mode.request.as_ref().and_then(|r| r.body.as_ref()),
        Some(&cr::BodyMode::Buffered)
    );
    assert_eq!(mode.allow_mode_override, Some(true));
    let writable = ext
        .metadata
        .as_ref()
        .and_then(|m| m.writable_namespaces.clone())
        .unwrap_or_default();
    assert!(
        writable.iter().any(|n| n == "envoy.lb"),
        "envoy.lb must be writable"
    );
    // The NetworkPolicy lets in that Gateway's Envoy proxies.
    let gateway = gw
        .iter()
        .find(|d| d.kind() == "Gateway")
        .expect("a Gateway");
    let peers = ingress_peer_labels(&aibrix.network_policy);
    assert!(
        peers.iter().any(|l| {
            l.get("gateway.envoyproxy.io/owning-gateway-name")
                .map(String::as_str)
                == Some(gateway.name())
                && l.get("gateway.envoyproxy.io/owning-gateway-namespace")
                    .map(String::as_str)
                    == Some(gateway.ns())
        }),
        "aibrix NetworkPolicy: no ingress from the proxies of Gateway {}/{}",
        gateway.ns(),
        gateway.name()
    );
    // The HTTPRoute's cross-namespace backend is granted.
    let grants = docs_of("deploy/kubernetes/gateway/envoy-gateway/referencegrant.yaml");
    let route_doc = find(&gw, "HTTPRoute", "kvroute-router");
    let route: Cr<cr::HttpRouteSpec> = custom(route_doc);
    for b in route.spec.rules.iter().flat_map(|r| &r.backend_refs) {
        let target_ns = b.namespace.as_deref().unwrap_or(route_doc.ns());
        if target_ns == route_doc.ns() {
            continue;
        }
        let granted = grants.iter().any(|g| {
            let grant: Cr<cr::ReferenceGrantSpec> = custom(g);
            g.ns() == target_ns
                && grant.spec.from.iter().any(|f| {
                    f.kind == "HTTPRoute"
                        && f.group == "gateway.networking.k8s.io"
                        && f.namespace == route_doc.ns()
                })
                && grant.spec.to.iter().any(|t| {
                    t.kind == "Service"
                        && t.group.is_empty()
                        && t.name.as_deref().is_none_or(|n| n == b.name)
                })
        });
        assert!(
            granted,
            "HTTPRoute kvroute-router → Service {target_ns}/{}: no ReferenceGrant",
            b.name
        );
    }
    // The grant for an EnvoyExtensionPolicy that calls the inference-pool overlay's kvroute.
    let picker_grant_doc = find(&grants, "ReferenceGrant", "kvroute-ext-proc-picker");
    let picker_grant: Cr<cr::ReferenceGrantSpec> = custom(picker_grant_doc);
    assert_eq!(picker_grant_doc.ns(), pool.namespace);
    assert!(picker_grant
        .spec
        .from
        .iter()
        .any(|f| f.kind == "EnvoyExtensionPolicy"
            && f.group == "gateway.envoyproxy.io"
            && f.namespace == policy_doc.ns()));
    assert!(picker_grant
        .spec
        .to
        .iter()
        .any(|t| t.name.as_deref() == Some(pool.service.as_str()) && t.kind == "Service"));

    // GIE style: the HTTPRoute's backend is the overlay's InferencePool, in its namespace, and
    // the NetworkPolicy lets in that Gateway's proxies.
    let Mode::InferencePool {
        name: pool_name,
        namespace: pool_ns,
    } = &pool.discovery
    else {
        panic!("inference-pool overlay: {:?}", pool.discovery)
    };
    let gie = docs_of("deploy/kubernetes/gateway/inference-pool/gateway.yaml");
    let gie_gateway = gie
        .iter()
        .find(|d| d.kind() == "Gateway")
        .expect("a Gateway");
    let gie_route_doc = gie
        .iter()
        .find(|d| d.kind() == "HTTPRoute")
        .expect("an HTTPRoute");
    let gie_route: Cr<cr::HttpRouteSpec> = custom(gie_route_doc);
    assert_eq!(
        gie_route_doc.ns(),
        pool_ns,
        "the HTTPRoute is in the pool's namespace"
    );
    assert!(gie_route
        .spec
        .parent_refs
        .iter()
        .all(|p| p.name == gie_gateway.name()
            && p.namespace.as_deref().unwrap_or(gie_route_doc.ns()) == gie_gateway.ns()));
    let backends: Vec<_> = gie_route
        .spec
        .rules
        .iter()
        .flat_map(|r| &r.backend_refs)
        .collect();
    assert!(!backends.is_empty());
    for b in backends {
        assert_eq!(
            (
                b.group.as_deref(),
                b.kind.as_deref(),
                b.name.as_str(),
                b.namespace.is_none()
            ),
            (
                Some("inference.networking.k8s.io"),
                Some("InferencePool"),
                pool_name.as_str(),
                true
            ),
            "the HTTPRoute's backend is the overlay's InferencePool"
        );
    }
    let peers = ingress_peer_labels(&pool.network_policy);
    assert!(
        peers.iter().any(|l| l
            .get("gateway.networking.k8s.io/gateway-name")
            .map(String::as_str)
            == Some(gie_gateway.name())),
        "inference-pool NetworkPolicy: no ingress from Gateway {}'s proxies",
        gie_gateway.name()
    );
    assert_eq!(
        gie_gateway.ns(),
        pool.namespace,
        "the Gateway's proxies run in its namespace (Istio)"
    );
}
