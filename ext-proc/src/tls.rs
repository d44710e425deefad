//! TLS on the gRPC and admin listeners (`[listen.tls]`): rustls with the ring provider, a PEM
//! certificate chain and key, and optionally client certificates required and verified
//! against a CA (mutual TLS, so that only the gateway can reach the ext_proc port). Read at
//! start-up (a reload that changes it asks for a restart).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// `[listen.tls]` as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The server's certificate chain, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs (PEM).
    pub client_ca: Option<PathBuf>,
    /// Whether the admin port serves TLS too (default true; its `/metrics` scraper then
    /// needs the CA, and a client certificate when `client_ca` is set).
    pub admin: Option<bool>,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("TLS: cannot read {what} from {path}: {reason}")]
    Pem {
        /// What was looked for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls rejected the certificates or key.
    #[error("TLS: {0}")]
    Rustls(String),
}

fn certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::Pem {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

impl TlsSection {
    /// Whether the admin port uses TLS too.
    pub fn on_admin(&self) -> bool {
        self.admin.unwrap_or(true)
    }

    /// An acceptor offering `alpn` (`h2` for gRPC, `http/1.1` for the admin port).
    pub fn acceptor(&self, alpn: &[&[u8]]) -> Result<TlsAcceptor, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(&self.cert, "a certificate chain")?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| TlsError::Pem {
            what: "a private key",
            path: self.key.clone(),
            reason: e.to_string(),
        })?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca, "client CA certificates")? {
                    roots
                        .add(c)
                        .map_err(|e| TlsError::Rustls(format!("client CA: {e}")))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| TlsError::Rustls(format!("client CA: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_empty_files_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("kvroute-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let s = TlsSection {
            cert: dir.join("absent.pem"),
            key: empty.clone(),
            ..Default::default()
        };
        let e = s.acceptor(&[b"h2"]).err().unwrap().to_string();
        assert!(e.contains("absent.pem"), "{e}");
        let s = TlsSection {
            cert: empty.clone(),
            key: empty,
            ..Default::default()
        };
        let e = s.acceptor(&[b"h2"]).err().unwrap().to_string();
        assert!(e.contains("no CERTIFICATE"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
