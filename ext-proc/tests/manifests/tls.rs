//! The TLS overlays (`deploy/kubernetes/tls/`): each is the plain overlay of the same name with
//! the components under `deploy/kubernetes/components/`. Checked as the plain overlays are
//! ([`check_overlay_at`]), plus what TLS adds: the Secret mounted where `[listen.tls]` reads
//! its files, the cert-manager chain that issues that Secret, the BackendTLSPolicy on the
//! Service port the gateway calls, nothing else changed from the plain overlay. Then served:
//! the binary started with the rendered configuration, on certificates made here and laid out
//! as the Secret's mount, answers the probes as the kubelet sends them and gRPC over TLS as
//! Envoy Gateway calls it (no ALPN, the policy's server name, its CA); the mutual-TLS variant
//! that `deploy/README.md` describes is rendered from an edited copy and served the same way.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PodSpec;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use super::*;

/// Each TLS overlay, and the plain overlay it is made from.
const TLS_OVERLAYS: [(&str, &str); 3] = [
    ("tls/aibrix", "aibrix"),
    ("tls/aibrix-all-namespaces", "aibrix-all-namespaces"),
    ("tls/inference-pool", "inference-pool"),
];

/// The keys of the Secret kvroute mounts, as cert-manager writes them (and as
/// `deploy/README.md` asks of a Secret made by hand): the chain, its key, the issuing CA.
const CERT_KEY: &str = "tls.crt";
const KEY_KEY: &str = "tls.key";
const CA_KEY: &str = "ca.crt";

/// A checked TLS overlay.
struct TlsOverlay {
    overlay: Overlay,
    /// Where the Secret is mounted.
    mount_path: String,
    secret: String,
    /// The name the gateway sends and checks: the BackendTLSPolicy's hostname.
    hostname: String,
    /// The server certificate's DNS names (its cert-manager Certificate).
    dns_names: Vec<String>,
}

fn pod_spec(o: &Overlay) -> &PodSpec {
    o.deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
}

fn find_ns<'a>(docs: &'a [Doc], kind: &str, ns: &str, name: &str) -> &'a Doc {
    docs.iter()
        .find(|d| d.kind() == kind && d.namespace() == Some(ns) && d.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {ns}/{name}"))
}

/// [`check_overlay_at`], then what TLS adds (see the module documentation).
fn check_tls_overlay_at(dir: &Path, name: &str) -> TlsOverlay {
    let overlay = check_overlay_at(dir, name);
    let tls = overlay
        .config
        .tls
        .clone()
        .unwrap_or_else(|| panic!("{name}: no [listen.tls] in the configuration"));
    let pod = pod_spec(&overlay);
    let c = &pod.containers[0];

    // The Secret's mount: the directory of [listen.tls]'s files, each a key of the Secret.
    let cert_dir = tls
        .cert
        .parent()
        .expect("cert in a directory")
        .to_path_buf();
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| Path::new(&m.mount_path) == cert_dir)
        .unwrap_or_else(|| panic!("{name}: nothing mounted at {}", cert_dir.display()));
    assert_eq!(
        mount.read_only,
        Some(true),
        "{name}: the TLS mount is read-only"
    );
    assert!(
        mount.sub_path.is_none() && mount.sub_path_expr.is_none(),
        "{name}: a subPath mount never sees a renewed Secret"
    );
    assert_ne!(
        mount.mount_path, CONFIG_DIR,
        "{name}: TLS files apart from the config"
    );
    let mut files = vec![(&tls.cert, CERT_KEY), (&tls.key, KEY_KEY)];
    if let Some(ca) = &tls.client_ca {
        files.push((ca, CA_KEY));
    }
    for (path, key) in files {
        assert_eq!(
            path,
            &cert_dir.join(key),
            "{name}: [listen.tls] file {} is not the Secret's {key} at {}",
            path.display(),
            mount.mount_path
        );
    }
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("the TLS volume");
    let source = volume
        .secret
        .as_ref()
        .unwrap_or_else(|| panic!("{name}: the TLS volume is not a Secret"));
    let secret = source.secret_name.clone().expect("secretName");
    assert!(
        source.items.is_none(),
        "{name}: items would rename the Secret's keys"
    );
    assert_ne!(
        source.optional,
        Some(true),
        "{name}: the Secret is required"
    );
    // Files the pod's user can read: other-readable, or group-readable by fsGroup.
    let mode = source.default_mode.unwrap_or(0o644);
    if mode & 0o004 == 0 {
        let psc = pod.security_context.as_ref().expect("pod securityContext");
        assert!(mode & 0o040 != 0, "{name}: mode {mode:o} unreadable");
        assert_eq!(
            psc.fs_group, psc.run_as_group,
            "{name}: mode {mode:o} needs fsGroup = the pod's group"
        );
    }
    // A renewed Secret reaches kvroute only through a restart (it reads the files at start).
    let reload = overlay
        .deployment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("secret.reloader.stakater.com/reload"));
    assert_eq!(
        reload.map(String::as_str),
        Some(secret.as_str()),
        "{name}: restart on renewal"
    );

    // cert-manager: the server Certificate writes that Secret, issued by a CA Issuer whose CA a
    // self-signed Issuer issued, all in kvroute's namespace.
    let ns = overlay.namespace.clone();
    let certificates: Vec<(&Doc, Cr<cr::CertificateSpec>)> =
        of_kind(&overlay.objects, "Certificate")
            .into_iter()
            .map(|d| (d, custom(d)))
            .collect();
    let issuer_of = |r: &cr::IssuerRef| -> Cr<cr::IssuerSpec> {
        assert_eq!(r.kind.as_deref().unwrap_or("Issuer"), "Issuer", "{name}");
        assert_eq!(
            r.group.as_deref().unwrap_or("cert-manager.io"),
            "cert-manager.io"
        );
        custom(find_ns(&overlay.objects, "Issuer", &ns, &r.name))
    };
    let mut dns_names = Vec::new();
    if !certificates.is_empty() {
        let (doc, server) = certificates
            .iter()
            .find(|(_, c)| c.spec.secret_name == secret)
            .unwrap_or_else(|| panic!("{name}: no Certificate writes the Secret {secret}"));
        assert_eq!(doc.ns(), ns);
        assert!(
            !server.spec.is_ca,
            "{name}: the server certificate is no CA"
        );
        assert!(
            server.spec.usages.contains(&cr::KeyUsage::ServerAuth),
            "{name}: server auth usage (the gateway checks it)"
        );
        assert!(!server.spec.dns_names.is_empty(), "{name}: dnsNames");
        dns_names = server.spec.dns_names.clone();
        let ca_issuer = issuer_of(&server.spec.issuer_ref);
        let ca_secret = ca_issuer
            .spec
            .ca
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: the server's Issuer is no CA Issuer"))
            .secret_name
            .clone();
        let (_, ca) = certificates
            .iter()
            .find(|(_, c)| c.spec.secret_name == ca_secret)
            .unwrap_or_else(|| panic!("{name}: no Certificate writes the CA Secret {ca_secret}"));
        assert!(ca.spec.is_ca, "{name}: the CA Certificate has isCA");
        assert!(
            issuer_of(&ca.spec.issuer_ref).spec.self_signed.is_some(),
            "{name}: the CA is self-signed"
        );
        let hours = |d: &Option<String>| -> u64 {
            let d = d.as_deref().expect("a duration");
            d.strip_suffix('h')
                .and_then(|h| h.parse().ok())
                .unwrap_or_else(|| panic!("{d}: hours"))
        };
        assert!(
            hours(&ca.spec.duration) > hours(&server.spec.duration),
            "{name}: the CA outlives the certificates it signs"
        );
        assert!(hours(&server.spec.renew_before) < hours(&server.spec.duration));
    }

    // Envoy Gateway: the BackendTLSPolicy on the Service's grpc port, with the CA of that
    // Secret and a name the certificate holds.
    let policies = of_kind(&overlay.objects, "BackendTLSPolicy");
    assert_eq!(policies.len(), 1, "{name}: one BackendTLSPolicy");
    let policy_doc = policies[0];
    assert_eq!(
        policy_doc.ns(),
        ns,
        "{name}: the policy sits in the Service's namespace"
    );
    let policy: Cr<cr::BackendTlsPolicySpec> = custom(policy_doc);
    assert_eq!(policy.spec.target_refs.len(), 1);
    let t = &policy.spec.target_refs[0];
    assert_eq!(
        (t.group.as_str(), t.kind.as_str(), t.name.as_str()),
        ("", "Service", overlay.service.as_str()),
        "{name}: the policy targets kvroute's Service"
    );
    let section = t
        .section_name
        .as_deref()
        .expect("sectionName: only the grpc port");
    let port = overlay
        .service_spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(section))
        .unwrap_or_else(|| panic!("{name}: the Service has no port {section}"));
    assert_eq!(
        port.port, GRPC_PORT,
        "{name}: the policy's section is the grpc port"
    );
    assert!(policy.spec.validation.well_known_ca_certificates.is_none());
    let refs = &policy.spec.validation.ca_certificate_refs;
    assert_eq!(refs.len(), 1, "{name}: one CA");
    assert_eq!(
        (
            refs[0].group.as_str(),
            refs[0].kind.as_str(),
            refs[0].name.as_str()
        ),
        ("", "Secret", secret.as_str()),
        "{name}: the CA is ca.crt of the mounted Secret"
    );
    let hostname = policy.spec.validation.hostname.clone();
    if !dns_names.is_empty() {
        assert!(
            dns_names.contains(&hostname),
            "{name}: the policy's hostname {hostname} is not in the certificate's {dns_names:?}"
        );
    }
    let mount_path = mount.mount_path.clone();
    TlsOverlay {
        overlay,
        mount_path,
        secret,
        hostname,
        dns_names,
    }
}

/// JSON-pointer paths where `a` and `b` differ (a list of another length counts as one).
fn differing_paths(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => differing_paths(&p, v, w, out),
                    _ => out.push(p),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                differing_paths(&format!("{path}/{i}"), v, w, out);
            }
        }
        _ if a == b => {}
        _ => out.push(path.to_owned()),
    }
}

fn toml_table(text: &str) -> toml::Table {
    toml::from_str(text).expect("kvroute.toml is TOML")
}

#[test]
fn tls_overlays_are_the_plain_ones_plus_tls() {
    for (tls_name, plain_name) in TLS_OVERLAYS {
        let t = check_tls_overlay_at(&repo().join("deploy/kubernetes").join(tls_name), tls_name);
        let p = check_overlay(plain_name);
        let tls = t.overlay.config.tls.clone().expect("[listen.tls]");
        // As shipped: both ports TLS (probes HTTPS), no client certificate asked (the gateway
        // needs none: Envoy Gateway with the BackendTLSPolicy alone, Envoy AI Gateway).
        assert!(tls.on_admin(), "{tls_name}: admin TLS");
        assert!(
            tls.client_ca.is_none(),
            "{tls_name}: client_ca is the documented option"
        );

        // The configuration: the plain one plus [listen.tls].
        let mut with = toml_table(&t.overlay.config_text);
        with["listen"]
            .as_table_mut()
            .expect("[listen]")
            .remove("tls")
            .expect("[listen.tls]");
        assert_eq!(
            with,
            toml_table(&p.config_text),
            "{tls_name}: the configuration differs from {plain_name}'s beyond [listen.tls]"
        );

        // The objects: the plain overlay's, changed only where TLS needs it, plus cert-manager's
        // and the BackendTLSPolicy.
        let plain: BTreeMap<_, _> = p.objects.iter().map(|d| (key(d), &d.value)).collect();
        let mut added = BTreeSet::new();
        for d in &t.overlay.objects {
            let Some(before) = plain.get(&key(d)) else {
                added.insert(d.kind().to_owned());
                continue;
            };
            let allowed: &[&str] = match d.kind() {
                "Deployment" => &[
                    "/metadata/annotations",
                    "/spec/template/metadata/annotations/prometheus.io~1scheme",
                    "/spec/template/spec/securityContext/fsGroup",
                    "/spec/template/spec/volumes",
                    "/spec/template/spec/containers/0/volumeMounts",
                    "/spec/template/spec/containers/0/livenessProbe/httpGet/scheme",
                    "/spec/template/spec/containers/0/readinessProbe/httpGet/scheme",
                ],
                "Service" => &["/spec/ports/0/appProtocol", "/spec/ports/1/appProtocol"],
                "ConfigMap" => &["/data/kvroute.toml"],
                _ => &[],
            };
            let mut diff = Vec::new();
            differing_paths("", before, &d.value, &mut diff);
            for path in &diff {
                assert!(
                    allowed.contains(&path.as_str()),
                    "{tls_name}: {:?} changed at {path} (only TLS settings may change)",
                    key(d)
                );
            }
            for list in ["volumes", "containers/0/volumeMounts"] {
                let ptr = format!("/spec/template/spec/{list}");
                if let (Some(Value::Array(a)), Some(Value::Array(b))) =
                    (before.pointer(&ptr), d.value.pointer(&ptr))
                {
                    assert!(
                        b.starts_with(a),
                        "{tls_name}: {list}: the plain entries first"
                    );
                }
            }
        }
        for k in plain.keys() {
            assert!(
                t.overlay.objects.iter().any(|d| &key(d) == k),
                "{tls_name}: {k:?} of {plain_name} is missing"
            );
        }
        assert_eq!(
            added,
            ["BackendTLSPolicy", "Certificate", "Issuer"]
                .into_iter()
                .map(String::from)
                .collect(),
            "{tls_name}: added kinds"
        );
        assert!(!t.dns_names.is_empty() && !t.secret.is_empty());
    }
}

/// The gateways reach the TLS overlays' kvroute: Envoy Gateway's extProc backendRef is the
/// Service and port the BackendTLSPolicy names; Istio's DestinationRule names that Service.
#[test]
fn gateway_wiring_speaks_tls_to_the_tls_overlays() {
    let gw = docs_of("envoy/gateway/gateway.yaml");
    let policy_doc = find(&gw, "EnvoyExtensionPolicy", "kvroute-ext-proc");
    let policy: Cr<cr::EnvoyExtensionPolicySpec> = custom(policy_doc);
    let backend = &policy.spec.ext_proc[0].backend_refs[0];
    let aibrix = check_tls_overlay_at(&repo().join("deploy/kubernetes/tls/aibrix"), "tls/aibrix");
    let backend_ns = backend.namespace.as_deref().unwrap_or(policy_doc.ns());
    let btp_doc = single(&aibrix.overlay.objects, "BackendTLSPolicy", "tls/aibrix");
    let btp: Cr<cr::BackendTlsPolicySpec> = custom(btp_doc);
    assert_eq!(
        btp_doc.ns(),
        backend_ns,
        "the BackendTLSPolicy sits with the extProc backend"
    );
    let target = &btp.spec.target_refs[0];
    assert_eq!(
        target.name, backend.name,
        "BackendTLSPolicy target = extProc backendRef"
    );
    let section_port = aibrix
        .overlay
        .service_spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name == target.section_name)
        .map(|p| p.port);
    assert_eq!(
        section_port,
        backend.port.map(i32::from),
        "the policy's sectionName is the port the extProc backendRef calls"
    );

    // Istio (inference-pool overlay): TLS to the picker's Service, the name it is issued for.
    let pool = check_tls_overlay_at(
        &repo().join("deploy/kubernetes/tls/inference-pool"),
        "tls/inference-pool",
    );
    let dr_docs =
        docs_of("deploy/kubernetes/gateway/inference-pool/istio-destinationrule-tls.yaml");
    let dr_doc = single(
        &dr_docs,
        "DestinationRule",
        "istio-destinationrule-tls.yaml",
    );
    let dr: Cr<cr::DestinationRuleSpec> = custom(dr_doc);
    assert_eq!(dr_doc.ns(), pool.overlay.namespace);
    assert_eq!(
        dr.spec.host,
        format!(
            "{}.{}.svc.cluster.local",
            pool.overlay.service, pool.overlay.namespace
        )
    );
    let tls = dr
        .spec
        .traffic_policy
        .and_then(|p| p.tls)
        .expect("trafficPolicy.tls");
    assert_eq!(
        tls.mode,
        cr::IstioTlsMode::SIMPLE,
        "TLS without a client certificate"
    );
    assert_eq!(tls.sni.as_deref(), Some(pool.hostname.as_str()));
    assert!(pool.dns_names.contains(&pool.hostname));
}

// ---- the mutual-TLS variant, as deploy/README.md has operators make it ----

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A scratch directory, removed on drop (kept when the test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "kvroute-manifests-{}-{tag}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = read(path);
    assert_eq!(
        text.matches(from).count(),
        1,
        "{}: the documented edit needs one {from:?}",
        path.display()
    );
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// `deploy/kubernetes/tls/aibrix` with client certificates, made in a copy of
/// `deploy/kubernetes` by the edits `deploy/README.md` ("Client certificates") lists.
fn mutual_tls_overlay(tmp: &TempDir) -> TlsOverlay {
    let root = tmp.0.join("kubernetes");
    copy_tree(&repo().join("deploy/kubernetes"), &root);
    let dir = root.join("tls/aibrix");
    edit(
        &dir.join("configmap.yaml"),
        "# client_ca = ",
        "client_ca = ",
    );
    edit(
        &dir.join("configmap.yaml"),
        "# admin = false",
        "admin = false",
    );
    edit(
        &dir.join("kustomization.yaml"),
        "- ../../components/tls\n",
        "- ../../components/tls\n- ../../components/tls-admin-plain\n",
    );
    check_tls_overlay_at(&dir, "tls/aibrix with client certificates")
}

#[test]
fn mutual_tls_variant_renders_as_documented() {
    let tmp = TempDir::new("mtls-render");
    let m = mutual_tls_overlay(&tmp);
    let tls = m.overlay.config.tls.clone().expect("[listen.tls]");
    assert_eq!(
        tls.client_ca.as_deref(),
        Some(Path::new(&m.mount_path).join(CA_KEY).as_path())
    );
    // check_overlay_at checked the probes are plain HTTP with the admin port plain.
    assert!(!tls.on_admin());
    let readme = read(&repo().join("deploy/README.md"));
    for needle in ["client_ca", "admin = false", "components/tls-admin-plain"] {
        assert!(
            readme.contains(needle),
            "deploy/README.md does not say {needle}"
        );
    }
}

mod served;
