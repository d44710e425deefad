//! The kustomize overlays (rendered by [`kustomize`](super::kustomize)), checked as a whole.

use super::*;

pub(crate) fn of_kind<'a>(docs: &'a [Doc], kind: &str) -> Vec<&'a Doc> {
    docs.iter().filter(|d| d.kind() == kind).collect()
}

pub(crate) fn single<'a>(docs: &'a [Doc], kind: &str, overlay: &str) -> &'a Doc {
    let found = of_kind(docs, kind);
    assert_eq!(
        found.len(),
        1,
        "{overlay}: want one {kind}, found {}",
        found.len()
    );
    found[0]
}

pub(crate) fn contains_labels(
    labels: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> bool {
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// RBAC rules as (API group, resource, verbs) triples.
pub(crate) fn rule_set(rules: &[PolicyRule]) -> BTreeSet<(String, String, BTreeSet<String>)> {
    let mut out = BTreeSet::new();
    for r in rules {
        assert!(
            r.resource_names.is_none() && r.non_resource_urls.is_none(),
            "unexpected rule {r:?}"
        );
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                out.insert((g.clone(), res.clone(), r.verbs.iter().cloned().collect()));
            }
        }
    }
    out
}

pub(crate) fn rules(
    list: &[(&str, &str, &[&str])],
) -> BTreeSet<(String, String, BTreeSet<String>)> {
    list.iter()
        .map(|(g, r, v)| {
            (
                g.to_string(),
                r.to_string(),
                v.iter().map(|s| s.to_string()).collect(),
            )
        })
        .collect()
}

pub(crate) fn port_number(p: &Option<IntOrString>) -> Option<i32> {
    match p {
        Some(IntOrString::Int(n)) => Some(*n),
        _ => None,
    }
}

/// Whether a NetworkPolicy peer selects the namespace `ns` (a namespaceSelector on
/// `kubernetes.io/metadata.name`, or `{}` for every namespace; no namespaceSelector = the
/// policy's own namespace).
pub(crate) fn peer_namespace_matches(
    peer: &NetworkPolicyPeer,
    own: &str,
    ns: Option<&str>,
) -> bool {
    match (&peer.namespace_selector, ns) {
        (None, Some(n)) => n == own,
        (None, None) => false,
        (Some(sel), None) => sel.match_labels.is_none() && sel.match_expressions.is_none(),
        (Some(sel), Some(n)) => {
            sel.match_expressions.is_none()
                && sel
                    .match_labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/metadata.name"))
                    .map(String::as_str)
                    == Some(n)
        }
    }
}

pub(crate) fn selects_aibrix_pods(sel: &Option<LabelSelector>) -> bool {
    let Some(sel) = sel else { return false };
    sel.match_labels.is_none()
        && sel.match_expressions.as_ref().is_some_and(|e| {
            e.len() == 1 && e[0].key == "model.aibrix.ai/name" && e[0].operator == "Exists"
        })
}

/// What an overlay deploys, once checked.
pub(crate) struct Overlay {
    pub(crate) objects: Vec<Doc>,
    pub(crate) namespace: String,
    pub(crate) service: String,
    pub(crate) pod_labels: BTreeMap<String, String>,
    pub(crate) discovery: Mode,
    pub(crate) network_policy: NetworkPolicy,
    pub(crate) deployment: Deployment,
    pub(crate) service_spec: k8s_openapi::api::core::v1::ServiceSpec,
    /// The ConfigMap's `kvroute.toml`, as written and as built.
    pub(crate) config_text: String,
    pub(crate) config: config::Config,
}

pub(crate) fn check_overlay(name: &str) -> Overlay {
    check_overlay_at(&repo().join("deploy/kubernetes").join(name), name)
}

/// [`check_overlay`] of the overlay in `dir` (a copy of `deploy/kubernetes` may hold it).
pub(crate) fn check_overlay_at(dir: &Path, name: &str) -> Overlay {
    let dir = dir.to_path_buf();
    let objects = render(&dir);
    for doc in &objects {
        check_document(doc);
    }
    if let Some(rendered) = kubectl_render(&dir) {
        let mine: BTreeMap<_, _> = objects.iter().map(|d| (key(d), &d.value)).collect();
        let theirs: BTreeMap<_, _> = rendered.iter().map(|d| (key(d), &d.value)).collect();
        assert_eq!(
            mine.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "{name}: kubectl kustomize renders other objects"
        );
        for (k, v) in &mine {
            if let Some(d) = first_difference("", v, theirs[k]) {
                panic!("{name}: {k:?} differs from kubectl kustomize's: {d}");
            }
        }
    } else {
        eprintln!(
            "{name}: kubectl not found; rendered by this test only (not compared with kustomize)"
        );
    }

    // The workload.
    let dep_doc = single(&objects, "Deployment", name);
    let namespace = dep_doc.ns().to_owned();
    for doc in &objects {
        if namespaced(doc.kind()) && !matches!(doc.kind(), "Role" | "RoleBinding") {
            assert_eq!(
                doc.ns(),
                namespace,
                "{name}: {} {} outside kvroute's namespace",
                doc.kind(),
                doc.name()
            );
        }
    }
    let deployment: Deployment = builtin(dep_doc);
    let spec = deployment.spec.as_ref().expect("Deployment spec");
    assert_eq!(
        spec.replicas,
        Some(1),
        "{name}: one replica (in-flight counts are per process)"
    );
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert!(
        contains_labels(
            &pod_labels,
            spec.selector
                .match_labels
                .as_ref()
                .expect("selector labels")
        ),
        "{name}: the Deployment's selector does not select its pods"
    );
    let pod = spec.template.spec.as_ref().expect("pod spec");
    let sa_doc = single(&objects, "ServiceAccount", name);
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some(sa_doc.name()),
        "{name}: service account"
    );
    assert_eq!(pod.containers.len(), 1, "{name}: one container");
    let c = &pod.containers[0];
    let ports: BTreeMap<_, _> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().expect("named port"), p.container_port))
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([
            ("grpc".to_owned(), GRPC_PORT),
            ("admin".to_owned(), ADMIN_PORT)
        ]),
        "{name}: container ports"
    );
    let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let h = p
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_eq!(
            h.port,
            IntOrString::String("admin".into()),
            "{name}: probes go to the admin port"
        );
        (
            h.path.clone().unwrap_or_default(),
            h.scheme.clone().unwrap_or_else(|| "HTTP".into()),
        )
    };
    let (liveness, liveness_scheme) = probe(&c.liveness_probe);
    let (readiness, readiness_scheme) = probe(&c.readiness_probe);
    assert_eq!(liveness, "/healthz", "{name}: liveness");
    assert_eq!(readiness, "/readyz", "{name}: readiness");
    // Security: non-root, read-only root, no capabilities, no privilege escalation, seccomp.
    let psc = pod.security_context.as_ref().expect("pod securityContext");
    let csc = c
        .security_context
        .as_ref()
        .expect("container securityContext");
    assert_eq!(psc.run_as_non_root, Some(true), "{name}: pod runAsNonRoot");
    assert_eq!(
        csc.run_as_non_root,
        Some(true),
        "{name}: container runAsNonRoot"
    );
    assert_eq!(
        csc.read_only_root_filesystem,
        Some(true),
        "{name}: readOnlyRootFilesystem"
    );
    assert_eq!(
        csc.allow_privilege_escalation,
        Some(false),
        "{name}: allowPrivilegeEscalation"
    );
    assert!(csc.privileged != Some(true), "{name}: privileged");
    let caps = csc.capabilities.as_ref().expect("capabilities");
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_owned()][..]),
        "{name}: drop ALL capabilities"
    );
    assert!(caps.add.is_none(), "{name}: no capability added");
    for sp in [&psc.seccomp_profile, &csc.seccomp_profile] {
        assert_eq!(
            sp.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault"),
            "{name}: seccomp"
        );
    }
    let res = c.resources.as_ref().expect("resources");
    let requests = res.requests.as_ref().expect("requests");
    assert!(
        requests.contains_key("cpu") && requests.contains_key("memory"),
        "{name}: requests"
    );
    assert!(
        res.limits
            .as_ref()
            .is_some_and(|l| l.contains_key("memory")),
        "{name}: memory limit"
    );
    // The configuration: the ConfigMap, mounted as a directory (a subPath mount never sees the
    // kubelet's updates, so reloads would not happen).
    assert_eq!(
        c.args.as_deref(),
        Some(&["--config".to_owned(), CONFIG_FILE.to_owned()][..]),
        "{name}: args"
    );
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == CONFIG_DIR)
        .expect("config mount");
    assert!(
        mount.sub_path.is_none() && mount.sub_path_expr.is_none(),
        "{name}: config mounted with subPath"
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("config volume");
    let cm_name = volume
        .config_map
        .as_ref()
        .expect("a ConfigMap volume")
        .name
        .clone();
    let cm_doc = single(&objects, "ConfigMap", name);
    assert_eq!(
        cm_doc.name(),
        cm_name,
        "{name}: the mounted ConfigMap is the overlay's"
    );
    let cfg = kvroute_config(cm_doc)
        .expect("data.kvroute.toml")
        .unwrap_or_else(|e| panic!("{name}: {}: {e}", cm_doc.origin));
    let config_text = cm_doc.value["data"]["kvroute.toml"]
        .as_str()
        .expect("kvroute.toml")
        .to_owned();
    // The admin port's scheme, for the kubelet's probes and annotation-driven Prometheus.
    let admin_tls = cfg.tls.as_ref().is_some_and(|t| t.on_admin());
    let scheme = if admin_tls { "HTTPS" } else { "HTTP" };
    assert_eq!(
        (liveness_scheme.as_str(), readiness_scheme.as_str()),
        (scheme, scheme),
        "{name}: probe schemes, with the admin port's TLS {admin_tls}"
    );
    let annotations = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    assert_eq!(
        annotations
            .get("prometheus.io/scheme")
            .map_or("http", String::as_str),
        scheme.to_ascii_lowercase(),
        "{name}: prometheus.io/scheme"
    );
    assert_eq!(
        cfg.grpc_listen,
        SocketAddr::from(([0, 0, 0, 0], GRPC_PORT as u16)),
        "{name}: listen.grpc"
    );
    assert_eq!(
        cfg.admin_listen,
        SocketAddr::from(([0, 0, 0, 0], ADMIN_PORT as u16)),
        "{name}: listen.admin"
    );
    let grace = spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.termination_grace_period_seconds)
        .expect("grace");
    assert!(
        cfg.shutdown_grace.as_secs() as i64 + 5 < grace,
        "{name}: shutdown_grace_secs + preStop must fit in terminationGracePeriodSeconds"
    );
    let discovery = match &cfg.discovery {
        Discovery::Kubernetes(k) => {
            assert!(
                k.api_server.is_none(),
                "{name}: in a pod, the service account is the client"
            );
            k.mode.clone()
        }
        Discovery::Static | Discovery::Envoy { .. } => {
            panic!("{name}: the overlays discover pods from Kubernetes")
        }
    };

    // The Service: selects the pod, grpc as HTTP/2 (what Envoy Gateway needs), admin.
    let svc_doc = single(&objects, "Service", name);
    let svc: Service = builtin(svc_doc);
    let svc_spec = svc.spec.as_ref().expect("Service spec");
    assert!(
        contains_labels(&pod_labels, svc_spec.selector.as_ref().expect("selector")),
        "{name}: Service selector"
    );
    let svc_ports: BTreeMap<_, _> = svc_spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().expect("named"),
                (p.port, p.target_port.clone(), p.app_protocol.clone()),
            )
        })
        .collect();
    // With TLS the grpc port is not cleartext HTTP/2 any more: no appProtocol (as the Gateway
    // API Inference Extension's own TLS picker Service); Envoy Gateway speaks gRPC to an
    // extProc backend whatever the port says.
    let grpc_protocol = cfg.tls.is_none().then(|| "kubernetes.io/h2c".to_owned());
    assert_eq!(
        svc_ports["grpc"],
        (
            GRPC_PORT,
            Some(IntOrString::String("grpc".into())),
            grpc_protocol
        ),
        "{name}: Service grpc port"
    );
    assert_eq!(
        svc_ports["admin"],
        (
            ADMIN_PORT,
            Some(IntOrString::String("admin".into())),
            Some(scheme.to_ascii_lowercase())
        ),
        "{name}: Service admin port"
    );
    assert_eq!(svc_ports.len(), 2, "{name}: Service ports");

    // RBAC: exactly what the discovery mode needs, bound to the ServiceAccount.
    let pods = ("", "pods", &["list", "watch"][..]);
    let pools = (
        "inference.networking.k8s.io",
        "inferencepools",
        &["get", "list", "watch"][..],
    );
    let mut expected_roles: BTreeMap<Option<String>, BTreeSet<_>> = BTreeMap::new();
    match &discovery {
        Mode::Aibrix { namespaces } if namespaces.is_empty() => {
            expected_roles.insert(None, rules(&[pods]));
        }
        Mode::Aibrix { namespaces } => {
            for n in namespaces {
                expected_roles.insert(Some(n.clone()), rules(&[pods]));
            }
        }
        Mode::InferencePool { namespace, .. } => {
            expected_roles.insert(Some(namespace.clone()), rules(&[pods, pools]));
        }
    }
    let mut found_roles = BTreeMap::new();
    for doc in of_kind(&objects, "Role") {
        let role: Role = builtin(doc);
        found_roles.insert(
            Some(doc.ns().to_owned()),
            (
                doc.name().to_owned(),
                rule_set(role.rules.as_deref().unwrap_or_default()),
            ),
        );
    }
    for doc in of_kind(&objects, "ClusterRole") {
        let role: ClusterRole = builtin(doc);
        assert!(
            role.aggregation_rule.is_none(),
            "{name}: aggregated ClusterRole"
        );
        found_roles.insert(
            None,
            (
                doc.name().to_owned(),
                rule_set(role.rules.as_deref().unwrap_or_default()),
            ),
        );
    }
    assert_eq!(
        found_roles
            .iter()
            .map(|(ns, (_, r))| (ns.clone(), r.clone()))
            .collect::<BTreeMap<_, _>>(),
        expected_roles,
        "{name}: RBAC rules (None = cluster-wide) differ from what {discovery:?} needs"
    );
    let sa_subject = (sa_doc.name().to_owned(), namespace.clone());
    let mut bound = BTreeSet::new();
    for doc in of_kind(&objects, "RoleBinding") {
        let b: RoleBinding = builtin(doc);
        assert_eq!(b.role_ref.kind, "Role", "{name}: {}", doc.origin);
        let (role_name, _) = &found_roles[&Some(doc.ns().to_owned())];
        assert_eq!(
            &b.role_ref.name, role_name,
            "{name}: {} binds another Role",
            doc.origin
        );
        let subjects: Vec<_> = b
            .subjects
            .iter()
            .flatten()
            .map(|s| (s.kind.clone(), s.name.clone(), s.namespace.clone()))
            .collect();
        assert_eq!(
            subjects,
            [(
                "ServiceAccount".to_owned(),
                sa_subject.0.clone(),
                Some(sa_subject.1.clone())
            )],
            "{name}: {} subjects",
            doc.origin
        );
        bound.insert(Some(doc.ns().to_owned()));
    }
    for doc in of_kind(&objects, "ClusterRoleBinding") {
        let b: ClusterRoleBinding = builtin(doc);
        assert_eq!(b.role_ref.kind, "ClusterRole", "{name}: {}", doc.origin);
        assert_eq!(
            b.role_ref.name, found_roles[&None].0,
            "{name}: {} binds another ClusterRole",
            doc.origin
        );
        let subjects: Vec<_> = b
            .subjects
            .iter()
            .flatten()
            .map(|s| (s.kind.clone(), s.name.clone(), s.namespace.clone()))
            .collect();
        assert_eq!(
            subjects,
            [(
                "ServiceAccount".to_owned(),
                sa_subject.0.clone(),
                Some(sa_subject.1.clone())
            )],
            "{name}: {} subjects",
            doc.origin
        );
        bound.insert(None);
    }
    assert_eq!(
        bound,
        expected_roles.keys().cloned().collect(),
        "{name}: every role bound once"
    );

    // The NetworkPolicy: selects the pod; lets in only 50052 and 9464, from named peers; lets
    // out the API server, DNS and the model pods' serving ports.
    let np_doc = single(&objects, "NetworkPolicy", name);
    let network_policy: NetworkPolicy = builtin(np_doc);
    let np = network_policy.spec.as_ref().expect("NetworkPolicy spec");
    let np_selector = np.pod_selector.as_ref().expect("NetworkPolicy podSelector");
    assert!(
        np_selector.match_expressions.is_none(),
        "{name}: NetworkPolicy podSelector"
    );
    assert!(
        contains_labels(
            &pod_labels,
            np_selector
                .match_labels
                .as_ref()
                .expect("podSelector labels")
        ),
        "{name}: the NetworkPolicy does not select kvroute's pod"
    );
    assert_eq!(
        np.policy_types.as_deref(),
        Some(&["Ingress".to_owned(), "Egress".to_owned()][..]),
        "{name}: policyTypes"
    );
    let mut ingress_ports = BTreeSet::new();
    for rule in np.ingress.iter().flatten() {
        assert!(
            rule.from.as_ref().is_some_and(|f| !f.is_empty()),
            "{name}: an ingress rule open to every source"
        );
        for p in rule.ports.iter().flatten() {
            ingress_ports.insert(port_number(&p.port).expect("numeric ingress port"));
        }
    }
    assert_eq!(
        ingress_ports,
        BTreeSet::from([GRPC_PORT, ADMIN_PORT]),
        "{name}: ingress ports"
    );
    let egress: Vec<_> = np.egress.iter().flatten().collect();
    let model_ports: BTreeSet<i32> = match &discovery {
        Mode::Aibrix { namespaces } => {
            let wanted: Vec<Option<&str>> = if namespaces.is_empty() {
                vec![None]
            } else {
                namespaces.iter().map(|n| Some(n.as_str())).collect()
            };
            for ns in wanted {
                let ok = egress.iter().any(|r| {
                    r.to.iter().flatten().any(|peer| {
                        peer_namespace_matches(peer, &namespace, ns)
                            && selects_aibrix_pods(&peer.pod_selector)
                    }) && r
                        .ports
                        .iter()
                        .flatten()
                        .any(|p| port_number(&p.port) == Some(AIBRIX_PORT))
                });
                assert!(
                    ok,
                    "{name}: no egress to the model pods of namespace {ns:?} on {AIBRIX_PORT}"
                );
            }
            BTreeSet::from([AIBRIX_PORT])
        }
        Mode::InferencePool {
            name: pool,
            namespace: pool_ns,
        } => {
            assert_eq!(
                pool_ns, &namespace,
                "{name}: kvroute must run in the pool's namespace (endpointPickerRef is local)"
            );
            let pool_doc = of_kind(&objects, "InferencePool")
                .into_iter()
                .find(|d| d.name() == pool)
                .unwrap_or_else(|| panic!("{name}: InferencePool {pool} not in the overlay"));
            assert_eq!(pool_doc.ns(), pool_ns, "{name}: InferencePool namespace");
            let ip: Cr<cr::InferencePoolSpec> = custom(pool_doc);
            let picker = ip
                .spec
                .endpoint_picker_ref
                .as_ref()
                .expect("endpointPickerRef");
            assert_eq!(
                picker.name,
                svc_doc.name(),
                "{name}: the pool's picker is kvroute's Service"
            );
            assert!(
                picker.kind.as_deref().unwrap_or("Service") == "Service"
                    && picker.group.as_deref().unwrap_or("").is_empty()
            );
            assert_eq!(
                picker.port.as_ref().map(|p| i32::from(p.number)),
                Some(GRPC_PORT),
                "{name}: picker port = the Service's grpc port"
            );
            let target: BTreeSet<i32> = ip
                .spec
                .target_ports
                .iter()
                .map(|p| i32::from(p.number))
                .collect();
            let ok = egress.iter().any(|r| {
                r.to.iter().flatten().any(|peer| {
                    peer.namespace_selector.is_none()
                        && peer.pod_selector.as_ref().is_some_and(|s| {
                            s.match_expressions.is_none()
                                && s.match_labels.as_ref() == Some(&ip.spec.selector.match_labels)
                        })
                }) && r
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|p| port_number(&p.port))
                    .collect::<BTreeSet<_>>()
                    == target
            });
            assert!(ok, "{name}: no egress to the pool's pods (its selector) on its target ports {target:?}");
            target
        }
    };
    for rule in &egress {
        for p in rule.ports.iter().flatten() {
            let n = port_number(&p.port).expect("numeric egress port");
            assert!(
                [443, 6443, 53].contains(&n) || model_ports.contains(&n),
                "{name}: egress port {n} is none of the API server, DNS or the model pods"
            );
        }
    }

    let service = svc_doc.name().to_owned();
    let service_spec = svc_spec.clone();
    Overlay {
        objects,
        namespace,
        service,
        pod_labels,
        discovery,
        network_policy,
        deployment,
        service_spec,
        config_text,
        config: cfg,
    }
}

#[test]
pub(crate) fn overlays_render_to_consistent_deployments() {
    for name in OVERLAYS {
        let o = check_overlay(name);
        assert!(!o.objects.is_empty());
        assert!(!o.pod_labels.is_empty());
    }
}
