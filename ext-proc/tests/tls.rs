//! TLS on kvroute-ext-proc's listeners, with certificates made in the test: a real Envoy
//! talks to the gRPC port over mutual TLS (the rendered config's transport socket), an Envoy
//! without a client certificate is refused (its requests fall back, unrouted), and the admin
//! port answers over TLS.

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use support::*;

/// Writes `ca.pem`, `server.pem`/`server.key` (for `kvroute-ext-proc` and 127.0.0.1) and
/// `client.pem`/`client.key` into `dir`.
fn certificates(dir: &TempDir) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Distinct names: a leaf whose issuer name is its own subject reads as self-signed.
    ca.distinguished_name
        .push(DnType::CommonName, "kvroute test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.path("ca.pem"), ca.pem()).unwrap();
    for (name, sans, usage) in [
        (
            "server",
            vec!["kvroute-ext-proc".to_owned(), "127.0.0.1".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        (
            "client",
            vec!["envoy".to_owned()],
            ExtendedKeyUsagePurpose::ClientAuth,
        ),
    ] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca).unwrap();
        std::fs::write(dir.path(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.path(&format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

fn tls_section(dir: &TempDir, admin: bool) -> String {
    format!(
        "[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nadmin = {admin}\n",
        dir.path("server.pem").display(),
        dir.path("server.key").display(),
        dir.path("ca.pem").display(),
    )
}

/// `kvroute-ext-proc envoy-config` for `config` with TLS flags.
fn render(config: &Path, grpc: &str, args: &[String]) -> Vec<u8> {
    let out = std::process::Command::new(ext_proc_bin())
        .arg("--config")
        .arg(config)
        .args(["--grpc-listen", grpc])
        .args([
            "envoy-config",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn envoy_routes_through_kvroute_over_mutual_tls() {
    let dir = TempDir::new("tls");
    certificates(&dir);
    let sims = [
        Sim::start(&dir, "replica-a", 5.0),
        Sim::start(&dir, "replica-b", 5.0),
    ];
    let config = dir.path("kvroute.toml");
    write_config(&config, &sims.iter().collect::<Vec<_>>(), "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{}{text}", tls_section(&dir, false))).unwrap();
    let ext = ExtProc::start(&dir, &config, None);
    let p = |f: &str| dir.path(f).display().to_string();

    // Without --tls-ca the renderer refuses: kvroute serves TLS only.
    let out = std::process::Command::new(ext_proc_bin())
        .arg("--config")
        .arg(&config)
        .arg("envoy-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    let with_cert = render(
        &config,
        &ext.grpc,
        &[
            "--tls-ca".into(),
            p("ca.pem"),
            "--tls-cert".into(),
            p("client.pem"),
            "--tls-key".into(),
            p("client.key"),
        ],
    );
    let envoy = Envoy::start_yaml(&dir, &with_cert);
    for i in 0..4 {
        let body = completion("study", &format!("over tls {i}"), 2, false);
        let r = http(&envoy.listen, "POST", "/v1/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            r.header("x-kvroute-decision").is_some(),
            "not routed: {r:?}"
        );
    }
    // Every side stream closed before Envoy goes (a connection lost mid-request would hold its
    // slot until the request's predicted end).
    wait_for(std::time::Duration::from_secs(5), || {
        (ext.in_flight() == 0).then_some(())
    })
    .expect("the routed requests were not released");
    drop(envoy);

    // An Envoy without a client certificate is refused: requests fall back, unrouted.
    let without = render(&config, &ext.grpc, &["--tls-ca".into(), p("ca.pem")]);
    let other = TempDir::new("tls-stranger");
    let stranger = Envoy::start_yaml(&other, &without);
    let body = completion("study", "no client certificate", 2, false);
    let r = http(&stranger.listen, "POST", "/v1/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("x-kvroute-decision").is_none(), "routed: {r:?}");
    let log = std::fs::read_to_string(&ext.log).unwrap();
    assert!(log.contains("TLS handshake failed"), "{log}");
    assert_eq!(ext.in_flight(), 0);
}

#[test]
fn the_admin_port_serves_tls_to_clients_with_a_certificate() {
    let dir = TempDir::new("tls-admin");
    certificates(&dir);
    let config = dir.path("kvroute.toml");
    let text = format!(
        "[listen]\ngrpc = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n{}[engine_metrics]\nscrape_interval_ms = 0\n[health]\ncheck_interval_ms = 0\n[models.m]\npods = [{{ name = \"a\", address = \"127.0.0.1:9\" }}]\n",
        tls_section(&dir, true)
    );
    std::fs::write(&config, text).unwrap();
    let ext = ExtProc::start(&dir, &config, None);
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(dir.path("ca.pem")).unwrap())
        .unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = || {
        ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
    };
    let get = |config: ClientConfig| -> std::io::Result<String> {
        let name = ServerName::try_from("kvroute-ext-proc").unwrap();
        let mut conn = tokio_rustls::rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut tcp = std::net::TcpStream::connect(&ext.admin)?;
        let mut tls = tokio_rustls::rustls::Stream::new(&mut conn, &mut tcp);
        tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")?;
        let mut out = String::new();
        tls.read_to_string(&mut out)?;
        Ok(out)
    };
    let chain = vec![CertificateDer::from_pem_file(dir.path("client.pem")).unwrap()];
    let key = PrivateKeyDer::from_pem_file(dir.path("client.key")).unwrap();
    let ok = get(builder().with_client_auth_cert(chain, key).unwrap()).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        get(builder().with_no_client_auth()).is_err(),
        "served without a client certificate"
    );
    // Plain HTTP to a TLS port gets no answer.
    assert!(try_http(&ext.admin, "GET", "/healthz", &[], b"").is_err());
}
