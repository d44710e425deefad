//! The Kubernetes manifests (`deploy/kubernetes/`, and `envoy/gateway/`, which
//! `deploy/README.md` has operators apply with them), read the way Kubernetes and the
//! controllers would read them.
//!
//! - **Every document of every YAML file** there is checked by its `apiVersion` and `kind`
//!   (and so is any Kubernetes object in the other YAML files under `deploy/`, e.g. next to
//!   Prometheus rules). Built-in kinds are deserialized into the `k8s-openapi` types,
//!   serialized back and compared with the document as JSON values: a misspelled or misplaced
//!   field, which serde would silently drop (and the API server would too, or reject), fails.
//!   Custom resources (InferencePool, Gateway API, Envoy Gateway) and kustomize's own files are
//!   read into the small structs of [`cr`], which name only the fields these manifests use and
//!   deny every other one (`#[serde(deny_unknown_fields)]`): a field that is not there is
//!   misspelled, or new here and must be added after checking it in the CRD's source (cited
//!   at the module). A kind with no check fails.
//! - **Every ConfigMap's `kvroute.toml`** is a kvroute configuration: `config::parse_toml`
//!   (unknown keys are errors) and `config::build`, as the binary does at start-up.
//! - **Each overlay** under `deploy/kubernetes/` is rendered (its resources, components, JSON
//!   and map-only strategic-merge patches, and the namespace transformer: the only kustomize
//!   features used; any other kustomization field fails) and checked as a whole: one replica,
//!   probes, security context, Service and NetworkPolicy selecting the pod, ports agreeing
//!   with the configuration, RBAC exactly what the configuration's discovery mode needs and
//!   bound to the ServiceAccount in kvroute's namespace, the InferencePool's picker pointing
//!   at the Service. Where `kubectl` is on PATH, `kubectl kustomize` renders each overlay too
//!   and must give the same objects.
//! - **The TLS overlays** (`deploy/kubernetes/tls/`, [`tls`]): the same checks, plus the
//!   Secret mounted where `[listen.tls]` looks, probes over HTTPS when the admin port is TLS,
//!   the cert-manager chain that issues the Secret, the BackendTLSPolicy on the Service port
//!   the EnvoyExtensionPolicy calls, nothing else changed from the plain overlay; and the
//!   binary started with the rendered configuration on certificates laid out as the Secret
//!   mount, answering the probes and gRPC over TLS as the kubelet and the gateway would call.
//! - The gateway wiring agrees with the overlays; the Dockerfile and `deploy/build-image.sh`
//!   agree with the Deployment; the paths and metric names `deploy/README.md` mentions exist.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvroute_ext_proc::config;
use kvroute_ext_proc::discovery::{Discovery, Mode};
use kvroute_ext_proc::env::EnvSnapshot;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

const OVERLAYS: [&str; 3] = ["aibrix", "aibrix-all-namespaces", "inference-pool"];
const GRPC_PORT: i32 = 50052;
const ADMIN_PORT: i32 = 9464;
const CONFIG_DIR: &str = "/etc/kvroute";
const CONFIG_FILE: &str = "/etc/kvroute/kvroute.toml";
/// AIBrix's default model port (no `model.aibrix.ai/port` label), which the AIBrix
/// NetworkPolicies open towards the model pods.
const AIBRIX_PORT: i32 = 8000;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("ext-proc/ is in the repository")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rel(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// One YAML document, with where it came from.
#[derive(Clone, Debug)]
struct Doc {
    origin: String,
    value: Value,
}

impl Doc {
    fn api_version(&self) -> &str {
        self.value["apiVersion"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no apiVersion", self.origin))
    }
    fn kind(&self) -> &str {
        self.value["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no kind", self.origin))
    }
    fn name(&self) -> &str {
        self.value["metadata"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no metadata.name", self.origin))
    }
    fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }
    /// The namespace of a namespaced object (which must have one once rendered).
    fn ns(&self) -> &str {
        self.namespace().unwrap_or_else(|| {
            panic!(
                "{}: {} {} has no namespace",
                self.origin,
                self.kind(),
                self.name()
            )
        })
    }
}

/// The `.yaml` and `.yml` files under `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = entry.expect("directory entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml")) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Every non-empty document of a multi-document YAML text.
fn parse_yaml(text: &str, origin: &str) -> Vec<Doc> {
    let mut docs = Vec::new();
    for (i, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value =
            Value::deserialize(de).unwrap_or_else(|e| panic!("{origin}, document {i}: {e}"));
        if value.is_null() {
            continue; // an empty document, e.g. after a trailing `---`
        }
        docs.push(Doc {
            origin: format!("{origin}, document {i}"),
            value,
        });
    }
    docs
}

fn load(path: &Path) -> Vec<Doc> {
    let docs = parse_yaml(&read(path), &rel(path));
    assert!(!docs.is_empty(), "{}: no YAML document", rel(path));
    docs
}

/// Every Kubernetes manifest file: under `deploy/kubernetes/`, and `envoy/gateway/`; not the
/// JSON patch files kustomizations name (lists of operations, applied and checked by
/// [`kustomize::render`]).
fn manifest_files() -> Vec<PathBuf> {
    let patches = kustomize::json_patch_files(&repo().join("deploy/kubernetes"));
    let mut files: Vec<PathBuf> = yaml_files(&repo().join("deploy/kubernetes"))
        .into_iter()
        .filter(|f| !patches.contains(f))
        .collect();
    files.extend(yaml_files(&repo().join("envoy/gateway")));
    assert!(files.len() >= 20, "too few manifests found: {files:?}");
    files
}

/// The documents of the other YAML files under `deploy/` (e.g. Prometheus rules) that are
/// Kubernetes objects (`apiVersion` and `kind`): they are checked like the manifests.
fn other_kubernetes_documents() -> Vec<Doc> {
    let manifests = repo().join("deploy/kubernetes");
    yaml_files(&repo().join("deploy"))
        .into_iter()
        .filter(|f| !f.starts_with(&manifests))
        .flat_map(|f| load(&f))
        .filter(|d| d.value.get("apiVersion").is_some() || d.value.get("kind").is_some())
        .collect()
}

/// Where `typed` differs from `file`, as a path into the document.
fn first_difference(path: &str, file: &Value, typed: &Value) -> Option<String> {
    match (file, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    None => {
                        return Some(format!(
                        "{p}: in the file but not in the type (misspelled, or in the wrong place?)"
                    ))
                    }
                    Some(vb) => {
                        if let Some(d) = first_difference(&p, va, vb) {
                            return Some(d);
                        }
                    }
                }
            }
            b.keys()
                .find(|k| !a.contains_key(*k))
                .map(|k| format!("{path}.{k}: added by the type"))
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(&format!("{path}[{i}]"), x, y)),
        _ if file == typed => None,
        _ => Some(format!(
            "{path}: {file} in the file, {typed} through the type"
        )),
    }
}

/// A built-in kind through its k8s-openapi type and back: nothing may be lost or changed.
fn builtin<T: DeserializeOwned + Serialize>(doc: &Doc) -> T {
    let t: T = serde_json::from_value(doc.value.clone())
        .unwrap_or_else(|e| panic!("{}: not a valid {}: {e}", doc.origin, doc.kind()));
    let back = serde_json::to_value(&t).expect("k8s-openapi types serialize");
    if let Some(d) = first_difference("", &doc.value, &back) {
        panic!(
            "{}: {} {} does not read back the same: {d}",
            doc.origin,
            doc.kind(),
            doc.name()
        );
    }
    t
}

/// A custom resource (or kustomize file) through its struct of [`cr`], which denies unknown
/// fields.
fn custom<T: DeserializeOwned>(doc: &Doc) -> T {
    serde_json::from_value(doc.value.clone()).unwrap_or_else(|e| {
        panic!(
            "{}: not a valid {} {}: {e}",
            doc.origin,
            doc.api_version(),
            doc.kind()
        )
    })
}

/// The structs custom resources are read into: only the fields the manifests use, every other
/// one denied. Sources (read at the commits named; check there before adding a field):
/// - InferencePool: kubernetes-sigs/gateway-api-inference-extension, `api/v1/inferencepool_types.go`
///   and `api/v1/shared_types.go` (84436a96b9e6ce2b59ddacd3d04c31b4fbd442de).
/// - Gateway API (`gateway.networking.k8s.io`): the standard channel's v1 GatewayClass, Gateway,
///   HTTPRoute and v1beta1 ReferenceGrant (kubernetes-sigs/gateway-api, `apis/`).
/// - Envoy Gateway (`gateway.envoyproxy.io/v1alpha1`): envoyproxy/gateway `api/v1alpha1/`
///   (`envoyextensionpolicy_types.go`, `ext_proc_types.go`, `envoypatchpolicy_types.go`,
///   `clienttrafficpolicy_types.go`, `connection_types.go`, `circuitbreaker_types.go`;
///   d32f28294245e454d20f81d323d626a90e660c1e).
/// - Gateway API `BackendTLSPolicy` (gateway.networking.k8s.io/v1, Gateway API v1.4 and later):
///   kubernetes-sigs/gateway-api `apis/v1/backendtlspolicy_types.go`, as in the CRD Envoy
///   Gateway bundles (`charts/gateway-helm/charts/crds/crds/gatewayapi-crds.yaml`, envoyproxy/gateway
///   d32f28294245e454d20f81d323d626a90e660c1e).
/// - cert-manager (`cert-manager.io/v1`): `Issuer` and `Certificate`, cert-manager/cert-manager
///   `pkg/apis/certmanager/v1/types_issuer.go` and `types_certificate.go`.
/// - Istio `DestinationRule` (`networking.istio.io/v1`): istio/api
///   `networking/v1alpha3/destination_rule.proto` (02462985e541055f1d83b09ecaa4e469383f217e).
/// - kustomize: `Kustomization` (kustomize.config.k8s.io/v1beta1), `Component`
///   (kustomize.config.k8s.io/v1alpha1), `patches` and the builtin `NamespaceTransformer`
///   (kubernetes-sigs/kustomize `api/types/kustomization.go`, `api/types/patch.go`,
///   `api/filters/namespace`), as `kubectl kustomize` (kustomize v5) reads them.
// The fields are there to be checked (a document may hold these and no others), not all to be
// read.
#[allow(dead_code)]
mod cr;

use cr::Cr;

/// Checks one document by its kind (see the module documentation).
fn check_document(doc: &Doc) {
    match (doc.api_version(), doc.kind()) {
        ("v1", "Namespace") => drop(builtin::<Namespace>(doc)),
        ("v1", "ServiceAccount") => drop(builtin::<ServiceAccount>(doc)),
        ("v1", "ConfigMap") => drop(builtin::<ConfigMap>(doc)),
        ("v1", "Service") => drop(builtin::<Service>(doc)),
        ("apps/v1", "Deployment") => drop(builtin::<Deployment>(doc)),
        ("policy/v1", "PodDisruptionBudget") => drop(builtin::<PodDisruptionBudget>(doc)),
        ("networking.k8s.io/v1", "NetworkPolicy") => drop(builtin::<NetworkPolicy>(doc)),
        ("rbac.authorization.k8s.io/v1", "Role") => drop(builtin::<Role>(doc)),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => drop(builtin::<RoleBinding>(doc)),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => drop(builtin::<ClusterRole>(doc)),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            drop(builtin::<ClusterRoleBinding>(doc))
        }
        ("kustomize.config.k8s.io/v1beta1", "Kustomization") => {
            drop(custom::<cr::Kustomization>(doc))
        }
        ("kustomize.config.k8s.io/v1alpha1", "Component") => drop(custom::<cr::Component>(doc)),
        ("builtin", "NamespaceTransformer") => drop(custom::<cr::NamespaceTransformer>(doc)),
        ("cert-manager.io/v1", "Issuer") => drop(custom::<Cr<cr::IssuerSpec>>(doc)),
        ("cert-manager.io/v1", "Certificate") => drop(custom::<Cr<cr::CertificateSpec>>(doc)),
        ("gateway.networking.k8s.io/v1", "BackendTLSPolicy") => {
            drop(custom::<Cr<cr::BackendTlsPolicySpec>>(doc))
        }
        ("networking.istio.io/v1", "DestinationRule") => {
            drop(custom::<Cr<cr::DestinationRuleSpec>>(doc))
        }
        ("inference.networking.k8s.io/v1", "InferencePool") => {
            drop(custom::<Cr<cr::InferencePoolSpec>>(doc))
        }
        ("gateway.networking.k8s.io/v1", "GatewayClass") => {
            drop(custom::<Cr<cr::GatewayClassSpec>>(doc))
        }
        ("gateway.networking.k8s.io/v1", "Gateway") => drop(custom::<Cr<cr::GatewaySpec>>(doc)),
        ("gateway.networking.k8s.io/v1", "HTTPRoute") => drop(custom::<Cr<cr::HttpRouteSpec>>(doc)),
        ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant") => {
            drop(custom::<Cr<cr::ReferenceGrantSpec>>(doc))
        }
        ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy") => {
            drop(custom::<Cr<cr::EnvoyExtensionPolicySpec>>(doc))
        }
        ("gateway.envoyproxy.io/v1alpha1", "EnvoyPatchPolicy") => {
            drop(custom::<Cr<cr::EnvoyPatchPolicySpec>>(doc))
        }
        ("gateway.envoyproxy.io/v1alpha1", "ClientTrafficPolicy") => {
            drop(custom::<Cr<cr::ClientTrafficPolicySpec>>(doc))
        }
        ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy") => {
            drop(custom::<Cr<cr::BackendTrafficPolicySpec>>(doc))
        }
        (api, kind) => panic!(
            "{}: {api} {kind}: no check for this kind here; add one",
            doc.origin
        ),
    }
}

#[test]
fn every_document_reads_back_as_its_kind() {
    let mut kinds = BTreeSet::new();
    for file in manifest_files() {
        for doc in load(&file) {
            check_document(&doc);
            kinds.insert(doc.kind().to_owned());
        }
    }
    for doc in other_kubernetes_documents() {
        check_document(&doc);
    }
    for kind in [
        "Deployment",
        "ConfigMap",
        "NetworkPolicy",
        "Role",
        "ClusterRole",
        "InferencePool",
        "HTTPRoute",
        "EnvoyExtensionPolicy",
        "PodDisruptionBudget",
        "Kustomization",
        "Component",
        "Issuer",
        "Certificate",
        "BackendTLSPolicy",
        "DestinationRule",
    ] {
        assert!(kinds.contains(kind), "no {kind} checked: {kinds:?}");
    }
}

/// The check catches what it is for: a misspelled field of a built-in kind (which serde alone
/// would drop), of a custom resource, and a value of the wrong type.
#[test]
fn the_document_checks_catch_misspellings() {
    let deployment = repo().join("deploy/kubernetes/base/deployment.yaml");
    let text = read(&deployment);
    for (from, to) in [
        ("readinessProbe:", "readynessProbe:"),
        (
            "readOnlyRootFilesystem: true",
            "readOnlyRootFileSystem: true",
        ),
        ("containerPort: 50052", "containerPort: \"50052\""),
    ] {
        assert!(text.contains(from), "{from} not in deployment.yaml");
        let docs = parse_yaml(&text.replacen(from, to, 1), "mutated deployment.yaml");
        let caught = std::panic::catch_unwind(|| docs.iter().for_each(check_document));
        assert!(caught.is_err(), "{from} → {to} was not caught");
    }
    let pool = repo().join("deploy/kubernetes/inference-pool/inferencepool.yaml");
    let text = read(&pool);
    for (from, to) in [
        ("endpointPickerRef:", "endpointPicker:"),
        ("failureMode: FailOpen", "failureMode: Open"),
    ] {
        assert!(text.contains(from), "{from} not in inferencepool.yaml");
        let docs = parse_yaml(&text.replacen(from, to, 1), "mutated inferencepool.yaml");
        let caught = std::panic::catch_unwind(|| docs.iter().for_each(check_document));
        assert!(caught.is_err(), "{from} → {to} was not caught");
    }
    for (file, from, to) in [
        (
            "components/tls-envoy-gateway/backendtlspolicy.yaml",
            "caCertificateRefs:",
            "caCertificateRef:",
        ),
        (
            "components/tls-envoy-gateway/backendtlspolicy.yaml",
            "sectionName: grpc",
            "section: grpc",
        ),
        (
            "components/tls-cert-manager/certificates.yaml",
            "dnsNames:",
            "dnsName:",
        ),
        (
            "components/tls-cert-manager/certificates.yaml",
            "- server auth",
            "- serverAuth",
        ),
        (
            "components/tls/kustomization.yaml",
            "patches:",
            "patchesJson6902:",
        ),
    ] {
        let text = read(&repo().join("deploy/kubernetes").join(file));
        assert!(text.contains(from), "{from} not in {file}");
        let docs = parse_yaml(&text.replacen(from, to, 1), &format!("mutated {file}"));
        let caught = std::panic::catch_unwind(|| docs.iter().for_each(check_document));
        assert!(caught.is_err(), "{file}: {from} → {to} was not caught");
    }
}

// ---- kvroute configurations ----

/// A ConfigMap's `kvroute.toml`, parsed and built as the binary does at start-up (no
/// environment overrides, no flags).
fn kvroute_config(doc: &Doc) -> Option<Result<config::Config, String>> {
    let cm: ConfigMap = builtin(doc);
    let text = cm.data.as_ref()?.get("kvroute.toml")?.clone();
    let path = Path::new("kvroute.toml");
    Some(
        config::parse_toml(&text, path)
            .map_err(|e| format!("parse_toml: {e}"))
            .and_then(|file| {
                config::build(
                    file,
                    &EnvSnapshot::default(),
                    &config::Overrides::default(),
                    7,
                )
                .map_err(|e| format!("build: {e}"))
            }),
    )
}

#[test]
fn every_configmap_is_a_kvroute_configuration() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in manifest_files() {
        for doc in load(&file) {
            if doc.kind() != "ConfigMap" {
                continue;
            }
            match kvroute_config(&doc) {
                None => failures.push(format!(
                    "{}: ConfigMap without data.kvroute.toml",
                    doc.origin
                )),
                Some(Err(e)) => failures.push(format!("{}: {e}", doc.origin)),
                Some(Ok(_)) => {}
            }
            checked += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "kvroute configurations refused:\n{}",
        failures.join("\n")
    );
    assert!(checked >= 4, "only {checked} ConfigMaps found");
}

mod kustomize;

use kustomize::*;

mod overlays;

use overlays::*;

mod gateway;

mod tls;

/// The fake API server of the discovery tests (the serving check in [`tls`] lists pods from
/// it, so that `/readyz` answers 200 as in a cluster).
#[path = "../support/k8s.rs"]
#[allow(dead_code)]
mod fake_kube;

// ---- gateway wiring (the test in gateway.rs) ----

fn docs_of(path: &str) -> Vec<Doc> {
    load(&repo().join(path))
}

fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Doc {
    docs.iter()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

// ---- the image ----

/// The runtime stage of the Dockerfile: its instructions after the last FROM.
fn dockerfile_runtime() -> (String, Vec<(String, String)>) {
    let text = read(&repo().join("Dockerfile"));
    let mut from = String::new();
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(rest) = line.strip_suffix('\\') {
            pending.push_str(rest);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let full = std::mem::take(&mut pending);
        let (op, args) = full.split_once(' ').unwrap_or((&full, ""));
        if op.eq_ignore_ascii_case("FROM") {
            from = args.trim().to_owned();
            instructions.clear();
        } else {
            instructions.push((op.to_ascii_uppercase(), args.trim().to_owned()));
        }
    }
    (from, instructions)
}

#[test]
fn image_matches_the_deployment() {
    let overlay = check_overlay("aibrix");
    let pod = overlay
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    let c = &pod.containers[0];
    let csc = c.security_context.as_ref().expect("securityContext");
    let user = format!(
        "{}:{}",
        csc.run_as_user.expect("runAsUser"),
        csc.run_as_group.expect("runAsGroup")
    );
    let ports: BTreeSet<i32> = c.ports.iter().flatten().map(|p| p.container_port).collect();

    let (from, ins) = dockerfile_runtime();
    assert_eq!(from, "scratch", "the runtime stage is FROM scratch");
    let get = |op: &str| -> Vec<&str> {
        ins.iter()
            .filter(|(o, _)| o == op)
            .map(|(_, a)| a.as_str())
            .collect()
    };
    assert_eq!(
        get("USER"),
        [user.as_str()],
        "Dockerfile USER = the Deployment's runAsUser:runAsGroup"
    );
    let exposed: BTreeSet<i32> = get("EXPOSE")
        .iter()
        .flat_map(|a| a.split_whitespace())
        .map(|p| p.parse().expect("port"))
        .collect();
    assert_eq!(exposed, ports, "Dockerfile EXPOSE = the container ports");
    let entrypoint: Vec<String> =
        serde_json::from_str(get("ENTRYPOINT")[0]).expect("ENTRYPOINT in JSON form");
    assert_eq!(entrypoint, ["/kvroute-ext-proc"]);
    assert_eq!(
        get("ENV"),
        [format!("KVROUTE_CONFIG={CONFIG_FILE}").as_str()],
        "Dockerfile ENV"
    );
    // The same image from deploy/build-image.sh (umoci).
    let script = read(&repo().join("deploy/build-image.sh"));
    let mut wanted = vec![
        format!("--config.user {user}"),
        format!("--config.entrypoint {}", entrypoint[0]),
        format!("--config.env KVROUTE_CONFIG={CONFIG_FILE}"),
    ];
    wanted.extend(
        ports
            .iter()
            .map(|p| format!("--config.exposedports {p}/tcp")),
    );
    for w in wanted {
        assert!(
            script.contains(&w),
            "deploy/build-image.sh does not set {w}"
        );
    }
    let ignore = read(&repo().join(".dockerignore"));
    assert!(
        ignore.lines().any(|l| l.trim() == "target"),
        ".dockerignore keeps target/ out of the build context"
    );
}

// ---- the operator's guide ----

#[test]
fn readme_names_only_what_exists() {
    let readme = read(&repo().join("deploy/README.md"));
    let mut paths = BTreeSet::new();
    let mut metrics = BTreeSet::new();
    for token in readme.split(|c: char| c.is_whitespace() || "`()[]<>\"',|".contains(c)) {
        let t = token.trim_end_matches(['.', ':', ';']);
        if ["deploy/", "envoy/", "ext-proc/", "Dockerfile"]
            .iter()
            .any(|p| t.starts_with(p))
            && !t.contains('*')
        {
            paths.insert(t.to_owned());
        }
        if t.starts_with("kvroute_")
            && t.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
        {
            metrics.insert(t.to_owned());
        }
    }
    assert!(paths.len() >= 10, "paths found: {paths:?}");
    for p in &paths {
        assert!(
            repo().join(p).exists(),
            "deploy/README.md names {p}, which does not exist"
        );
    }
    let mut source = String::new();
    let mut stack = vec![repo().join("ext-proc/src")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("src") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                source.push_str(&read(&p));
            }
        }
    }
    assert!(!metrics.is_empty());
    for m in &metrics {
        // prometheus-client appends _total to counters' registered names.
        let registered = m.strip_prefix("kvroute_").unwrap_or(m);
        let registered = registered.strip_suffix("_total").unwrap_or(registered);
        assert!(
            source.contains(&format!("\"{registered}\""))
                || source.contains(&format!("\"{m}\""))
                || source.contains(&format!("\"kvroute_{registered}\"")),
            "deploy/README.md names the metric {m}, not found in ext-proc/src"
        );
    }
}

/// The example model server carries what both discovery modes look for.
#[test]
fn example_model_server_is_found_by_both_modes() {
    let docs = docs_of("deploy/kubernetes/examples/vllm-llama3-8b.yaml");
    let dep_doc = single(&docs, "Deployment", "example");
    let dep: Deployment = builtin(dep_doc);
    let tpl = &dep.spec.as_ref().expect("spec").template;
    let labels = tpl
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let pod = tpl.spec.as_ref().expect("pod spec");
    let ports: BTreeSet<i32> = pod
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| p.container_port)
        .collect();
    assert!(
        pod.containers.iter().all(|c| c.readiness_probe.is_some()),
        "a readiness probe decides when a pod is routable"
    );

    // AIBrix mode: the model label, the port label (or 8000), a watched namespace.
    let aibrix = check_overlay("aibrix");
    let Mode::Aibrix { namespaces } = &aibrix.discovery else {
        panic!("aibrix overlay: {:?}", aibrix.discovery)
    };
    assert!(
        labels
            .get("model.aibrix.ai/name")
            .is_some_and(|m| !m.is_empty()),
        "model.aibrix.ai/name"
    );
    let port: i32 = labels
        .get("model.aibrix.ai/port")
        .map_or(8000, |p| p.parse().expect("a port number"));
    assert!(
        ports.contains(&port),
        "model.aibrix.ai/port {port} is not a container port {ports:?}"
    );
    assert!(
        namespaces.iter().any(|n| n == dep_doc.ns()),
        "{} is not watched: {namespaces:?}",
        dep_doc.ns()
    );

    // InferencePool mode: the pool's selector and target ports, in its namespace.
    let pool = check_overlay("inference-pool");
    let Mode::InferencePool { name, namespace } = &pool.discovery else {
        panic!("inference-pool overlay: {:?}", pool.discovery)
    };
    let pool_doc = find(&pool.objects, "InferencePool", name);
    let ip: Cr<cr::InferencePoolSpec> = custom(pool_doc);
    assert!(
        contains_labels(&labels, &ip.spec.selector.match_labels),
        "the pool's selector does not select the example"
    );
    assert!(
        ip.spec
            .target_ports
            .iter()
            .all(|p| ports.contains(&i32::from(p.number))),
        "the pool's target ports"
    );
    assert_eq!(dep_doc.ns(), namespace);

    // The Service the gateway falls back to selects the pods.
    let svc: Service = builtin(single(&docs, "Service", "example"));
    assert!(contains_labels(
        &labels,
        svc.spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .expect("selector")
    ));
}
