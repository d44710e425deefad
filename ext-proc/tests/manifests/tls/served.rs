//! The TLS overlays served: the binary on the rendered configuration and certificates made
//! here, probed as the kubelet and called as Envoy Gateway calls it.

use super::*;

/// The CA, kvroute's server certificate (for `names`, as the Certificate asks) and a client
/// certificate (the gateway's), in PEM.
struct Certs {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn certificates(names: &[String]) -> Certs {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "kvroute-ext-proc CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let leaf = |sans: Vec<String>, cn: &str, usage| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Certs {
        ca: ca.pem(),
        server: leaf(
            names.to_vec(),
            "kvroute-ext-proc",
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        client: leaf(
            vec!["envoy".into()],
            "envoy",
            ExtendedKeyUsagePurpose::ClientAuth,
        ),
    }
}

/// The binary, killed on drop.
struct Served {
    child: Child,
    grpc: String,
    admin: String,
    log: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `kvroute-ext-proc` with the overlay's configuration, its TLS files written under
/// `tmp` as the Secret mount lays them out, its API server the fake one (through a
/// kubeconfig: the configuration is used unchanged but for the files' directory), listening on
/// loopback ports chosen by the system.
fn serve(t: &TlsOverlay, tmp: &TempDir, api: &fake_kube::FakeApi, certs: &Certs) -> Served {
    let mount = tmp.0.join(t.mount_path.trim_start_matches('/'));
    std::fs::create_dir_all(&mount).unwrap();
    std::fs::write(mount.join(CA_KEY), &certs.ca).unwrap();
    std::fs::write(mount.join(CERT_KEY), &certs.server.0).unwrap();
    std::fs::write(mount.join(KEY_KEY), &certs.server.1).unwrap();
    let from = format!("\"{}/", t.mount_path);
    assert!(t.overlay.config_text.contains(&from));
    let text = t
        .overlay
        .config_text
        .replace(&from, &format!("\"{}/", mount.display()));
    let config = tmp.0.join("kvroute.toml");
    std::fs::write(&config, text).unwrap();
    let kubeconfig = tmp.0.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\n",
            api.url
        ),
    )
    .unwrap();
    let log = tmp.0.join("ext-proc.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute-ext-proc"))
        .arg("--config")
        .arg(&config)
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--workers", "2"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start kvroute-ext-proc");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref().map_while(Result::ok) {
            if line.contains("listening grpc=") {
                let _ = tx.send(line);
                break;
            }
        }
        for _ in lines {}
    });
    let mut served = Served {
        child,
        grpc: String::new(),
        admin: String::new(),
        log,
    };
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| {
            panic!(
                "kvroute-ext-proc did not start; log:\n{}",
                std::fs::read_to_string(&served.log).unwrap_or_default()
            )
        });
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {line}"))
            .to_owned()
    };
    served.grpc = field("grpc=");
    served.admin = field("admin=");
    served
}

/// A client as the gateway is one: trusting the CA, offering `alpn`, with the gateway's client
/// certificate when `client` is set.
fn client_config(certs: &Certs, alpn: &[&[u8]], client: bool) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(certs.ca.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = if client {
        let chain = vec![CertificateDer::from_pem_slice(certs.client.0.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(certs.client.1.as_bytes()).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// `GET path` on `addr`, over TLS (server name `name`) when `tls` is given; the status line.
fn get(addr: &str, path: &str, tls: Option<(Arc<ClientConfig>, &str)>) -> std::io::Result<String> {
    let mut tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: kvroute\r\nconnection: close\r\n\r\n");
    let mut out = Vec::new();
    match tls {
        Some((config, name)) => {
            let name = ServerName::try_from(name.to_owned()).unwrap();
            let mut conn = tokio_rustls::rustls::ClientConnection::new(config, name).unwrap();
            let mut s = tokio_rustls::rustls::Stream::new(&mut conn, &mut tcp);
            s.write_all(request.as_bytes())?;
            s.read_to_end(&mut out)?;
        }
        None => {
            tcp.write_all(request.as_bytes())?;
            tcp.read_to_end(&mut out)?;
        }
    }
    let text = String::from_utf8_lossy(&out);
    Ok(text.lines().next().unwrap_or("").to_owned())
}

/// The kubelet's probes of the Deployment (path and scheme), until each answers 200.
fn probes_answer(t: &TlsOverlay, s: &Served, certs: &Certs) {
    let c = &pod_spec(&t.overlay).containers[0];
    for probe in [&c.liveness_probe, &c.readiness_probe] {
        let h = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap();
        let path = h.path.clone().unwrap();
        let https = h.scheme.as_deref() == Some("HTTPS");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // The kubelet verifies no certificate; this client verifies it against the CA.
            let tls = https.then(|| {
                (
                    client_config(certs, &[b"http/1.1"], false),
                    t.hostname.as_str(),
                )
            });
            let status = get(&s.admin, &path, tls);
            if matches!(&status, Ok(l) if l.starts_with("HTTP/1.1 200")) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "probe {path} (HTTPS {https}): {status:?}; log:\n{}",
                std::fs::read_to_string(&s.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        if https {
            let plain = get(&s.admin, &path, None);
            assert!(
                !matches!(&plain, Ok(l) if l.starts_with("HTTP/1.1")),
                "the TLS admin port answered plain HTTP: {plain:?}"
            );
        }
    }
}

/// A gRPC health check (`grpc.health.v1.Health/Check`, service "") over TLS with `config`,
/// sending `name` as the server name: Ok(the response message) when grpc-status is 0.
fn grpc_health(addr: &str, config: Arc<ClientConfig>, name: &str) -> Result<Vec<u8>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use bytes::Bytes;
        use http_body_util::{BodyExt, Full};
        let call = async {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            let server = ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(server, tcp)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            let (mut sender, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                hyper_util::rt::TokioIo::new(tls),
            )
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
            let conn = tokio::spawn(conn);
            let request =
                hyper::Request::post(format!("https://{name}/grpc.health.v1.Health/Check"))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
                    .unwrap();
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("request: {e}"))?;
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?;
            conn.abort();
            let status = body
                .trailers()
                .and_then(|t| t.get("grpc-status").cloned())
                .or_else(|| headers.get("grpc-status").cloned());
            match status.as_ref().map(|v| v.as_bytes()) {
                Some(b"0") => Ok(body.to_bytes().to_vec()),
                other => Err(format!("grpc-status {other:?}")),
            }
        };
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .map_err(|_| "timed out".to_owned())?
    })
}

/// grpc.health.v1 HealthCheckResponse { status: SERVING }, length-prefixed.
const SERVING: [u8; 7] = [0, 0, 0, 0, 2, 8, 1];

#[test]
fn tls_overlay_serves_as_rendered() {
    let t = check_tls_overlay_at(&repo().join("deploy/kubernetes/tls/aibrix"), "tls/aibrix");
    let tmp = TempDir::new("tls-serve");
    let api = fake_kube::FakeApi::start();
    let certs = certificates(&t.dns_names);
    let s = serve(&t, &tmp, &api, &certs);
    probes_answer(&t, &s, &certs);
    // Envoy Gateway's ext_proc cluster: TLS offering no ALPN, HTTP/2, the policy's server name;
    // Envoy with `envoy-config --tls-ca` offers h2.
    for alpn in [&[][..], &[&b"h2"[..]][..]] {
        let r = grpc_health(&s.grpc, client_config(&certs, alpn, false), &t.hostname);
        assert_eq!(r.as_deref(), Ok(&SERVING[..]), "ALPN {alpn:?}");
    }
    // A server name the certificate does not hold is refused by the client's check.
    assert!(grpc_health(&s.grpc, client_config(&certs, &[], false), "elsewhere").is_err());
}

#[test]
fn mutual_tls_variant_serves_as_documented() {
    let tmp = TempDir::new("mtls-serve");
    let t = mutual_tls_overlay(&tmp);
    let api = fake_kube::FakeApi::start();
    let certs = certificates(&t.dns_names);
    let s = serve(&t, &tmp, &api, &certs);
    // The admin port is plain: the probes as rendered (HTTP) answer.
    probes_answer(&t, &s, &certs);
    let with = grpc_health(&s.grpc, client_config(&certs, &[], true), &t.hostname);
    assert_eq!(with.as_deref(), Ok(&SERVING[..]));
    let without = grpc_health(&s.grpc, client_config(&certs, &[], false), &t.hostname);
    assert!(without.is_err(), "served without a client certificate");
    // kvroute logs the refused handshake (as it ends on its side, maybe after the client's).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = std::fs::read_to_string(&s.log).unwrap_or_default();
        if log.contains("TLS handshake failed") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no refused handshake logged:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every command of deploy/README.md's "TLS" section is run by these tests (`kubectl
/// kustomize` of a TLS overlay) or marked as not run.
#[test]
fn readme_tls_commands_are_run_or_marked() {
    let readme = read(&repo().join("deploy/README.md"));
    let start = readme.find("\n## TLS").expect("a TLS section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut commands = 0;
    let mut in_sh = false;
    for line in section.lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            l if in_sh && !l.is_empty() && !l.starts_with('#') => {
                commands += 1;
                let run = TLS_OVERLAYS
                    .iter()
                    .any(|(o, _)| l == format!("kubectl kustomize deploy/kubernetes/{o}"));
                assert!(
                    run || l.contains("# not run here"),
                    "deploy/README.md, TLS: {l:?} is neither run by a test nor marked"
                );
            }
            _ => {}
        }
    }
    assert!(commands >= 3, "TLS section: {commands} commands");
}
