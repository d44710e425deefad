//! # kvroute-ext-proc
//!
//! Envoy's external-processing (`envoy.service.ext_proc.v3`) service around
//! [`kvroute_core`]: Envoy sends each request's headers and buffered JSON body, kvroute picks
//! the pod and answers with `envoy.lb` dynamic metadata (the shipped `envoy/envoy.yaml`
//! routes on it), and releases the request's in-flight slot exactly once when Envoy closes
//! the side stream at the end of the response.
//!
//! Shape (linkerd2-proxy style): `main` parses flags ([`cli`]), loads the configuration
//! ([`config`], [`mod@env`]), sets up logging, builds the runtime and calls
//! [`run`]`(config, source, shutdown)`, which binds the listeners, serves until the shutdown
//! future completes and drains within the grace period.
//!
//! Modules: [`service`] (gRPC service) → [`stream`] (per-request state machine) →
//! [`extract`] (prompt), [`respond`] (replies), [`ticket_guard`] (exactly-once release),
//! [`stream_timing`] (first token and usage of a few streamed responses), [`admission`]
//! (requests held or shed under saturation);
//! [`shared`] (router + settings), [`metrics`], [`admin`], [`maintenance`] (router timers),
//! [`reload`] (SIGHUP / file change), [`scrape`] (engine `/metrics` → the core, and the
//! active health checks), [`kv_events`] (engine KV-cache events → the core's engine views), [`health`] (outcomes and the `[health]` section), [`shutdown`],
//! [`envoy_config`] (Envoy YAML).

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod admin;
pub mod admission;
pub mod cli;
pub mod config;
pub mod connection;
pub mod data_parallel;
pub mod discovery;
pub mod duplex;
pub mod engines;
pub mod env;
pub mod envoy_config;
pub mod envoy_context;
pub mod envoy_module_config;
pub mod extract;
pub mod health;
pub mod introspect;
pub mod kv_events;
pub mod maintenance;
pub mod metrics;
pub mod process_metrics;
pub mod reload;
pub mod respond;
pub mod routing;
pub mod scrape;
pub mod service;
pub mod shared;
pub mod shutdown;
pub mod stream;
pub mod stream_timing;
pub mod ticket_guard;
pub mod tls;
pub mod tokenize;

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::ServingStatus;

use crate::config::{Config, ConfigSource};
use crate::service::ExtProc;
use crate::shared::Shared;

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration could not be applied to a new router.
    #[error("cannot build the router: {0}")]
    Apply(#[from] shared::ApplyError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The IO error.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// `[discovery] source = "envoy"` outside Envoy.
    #[error("[discovery] source = \"envoy\" works only inside Envoy (the dynamic module libkvroute_envoy.so): kvroute-ext-proc cannot see Envoy's clusters")]
    EnvoyDiscovery,
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), Error> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let local = l
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    Ok((l, local))
}

/// The largest ext_proc message kvroute decodes, for a `max_body_bytes` limit. Envoy buffers
/// up to 2 × `max_body_bytes` (envoy/envoy.template.yaml) and sends the body in one message:
/// decoding at least that lets kvroute answer oversized bodies with its 413 instead of failing
/// the stream. Set at start-up from the start-up limit; a reload cannot change it
/// ([`reload::restart_only_changes`]).
pub fn grpc_decode_limit(max_body_bytes: usize) -> usize {
    max_body_bytes
        .saturating_mul(2)
        .max(16 << 20)
        .saturating_add(64 << 10)
}

/// The start-up line that says what was loaded.
fn log_loaded(config: &Config, path: Option<&std::path::Path>) {
    let pods: Vec<String> = config
        .all_pods()
        .iter()
        .map(|p| format!("{}={}", p.name, p.address))
        .collect();
    let discovery = match &config.discovery {
        discovery::Discovery::Static => "static".to_owned(),
        discovery::Discovery::Kubernetes(k) => format!("kubernetes {:?}", k.mode),
        discovery::Discovery::Envoy { model } => format!("envoy (model {model})"),
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = ?path,
        discovery,
        default_strategy = %config.default_strategy_text,
        models = ?config.models.keys().collect::<Vec<_>>(),
        pods = ?pods,
        max_body_bytes = config.max_body_bytes,
        engine_scrape_ms = config.scrape_interval.map(|d| d.as_millis() as u64),
        health = ?config.router.health,
        "configuration loaded"
    );
}

/// Everything of the service but the ext_proc server, running on the current tokio runtime:
/// the router and its metrics ([`Shared`]), the admin listener (`/metrics`, `/healthz`,
/// `/readyz`, `/debug/*`), the router's timers, admission's pump ([`admission::run`]), pod
/// discovery, the engine scraper and
/// active health checks, and configuration reload. The in-Envoy module (crate
/// `kvroute-envoy`) runs this on a thread of its own and routes on [`Background::shared`].
#[derive(Debug)]
pub struct Background {
    /// The router and everything requests read.
    pub shared: Arc<Shared>,
    /// The admin listener's address.
    pub admin_addr: SocketAddr,
    /// Where Envoy publishes its upstream hosts (`[discovery] source = "envoy"`).
    pub envoy_feed: Option<discovery::envoy::EnvoyFeed>,
    stop_tx: watch::Sender<bool>,
}

impl Background {
    /// Builds the router from `config` and starts the background tasks (see the type's
    /// docs). Binds the admin listener (`config.admin_listen`, TLS when configured for it).
    pub async fn start(
        config: &Config,
        source: ConfigSource,
        reload: reload::Trigger,
    ) -> Result<Background, Error> {
        let mut registry = Registry::default();
        let shared = Shared::new(config, &mut registry)?;
        let discovery = discovery::Source::register(config.discovery.clone(), &mut registry);
        let envoy_feed = discovery.envoy_feed();
        let kv_status = kv_events::KvEventsStatus::default();
        kv_status.register(&mut registry, shared.router.clone());
        process_metrics::register(&mut registry);
        let registry = Arc::new(registry);
        let (admin, admin_addr) = bind(config.admin_listen).await?;
        let admin_tls = match &config.tls {
            Some(t) if t.on_admin() => Some(t.acceptor(&[b"http/1.1"])?),
            _ => None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(admin::serve(
            connection::incoming(admin, admin_tls, "admin"),
            registry,
            shared.clone(),
            stop_rx.clone(),
        ));
        tokio::spawn(maintenance::run(shared.clone(), stop_rx.clone()));
        tokio::spawn(admission::run(shared.clone(), stop_rx.clone()));
        discovery.spawn(shared.clone(), stop_rx.clone());
        tokio::spawn(scrape::run(shared.clone(), stop_rx.clone()));
        tokio::spawn(kv_events::run(shared.clone(), kv_status, stop_rx.clone()));
        tokio::spawn(reload::run(
            source,
            shared.clone(),
            config.clone(),
            reload,
            stop_rx,
        ));
        Ok(Background {
            shared,
            admin_addr,
            envoy_feed,
            stop_tx,
        })
    }

    /// Stops the background tasks (also done when dropped).
    pub fn stop(&self) {
        let _ = self.stop_tx.send(true);
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves until `shutdown` completes, then stops accepting, reports NOT_SERVING (gRPC health
/// and `/readyz`), and lets open ext_proc streams finish within `config.shutdown_grace` (the
/// start-up value: a reload does not change it).
///
/// Once listening, prints one stdout line `kvroute-ext-proc listening grpc=ADDR admin=ADDR`
/// (useful with port 0).
pub async fn run(
    config: Config,
    source: ConfigSource,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    if matches!(config.discovery, discovery::Discovery::Envoy { .. }) {
        return Err(Error::EnvoyDiscovery);
    }
    let config_path = source.path.clone();
    let grpc_tls = match &config.tls {
        Some(t) => Some(t.acceptor(&[b"h2"])?),
        None => None,
    };
    let (grpc, grpc_addr) = bind(config.grpc_listen).await?;
    let background = Background::start(&config, source, reload::Trigger::FileAndSighup).await?;
    let shared = background.shared.clone();
    let admin_addr = background.admin_addr;

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ExternalProcessorServer<ExtProc>>()
        .await;
    health.set_service_status("", ServingStatus::Serving).await;

    let ext_proc = ExternalProcessorServer::new(ExtProc::new(shared.clone()))
        .max_decoding_message_size(grpc_decode_limit(config.max_body_bytes));
    let incoming = connection::incoming(grpc, grpc_tls, "grpc");
    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    let server = connection::harden(tonic::transport::Server::builder())
        .add_service(health_service)
        .add_service(ext_proc)
        .serve_with_incoming_shutdown(incoming, async {
            let _ = drain_rx.await;
        });
    tokio::pin!(server);

    shared.set_ready(true);
    log_loaded(&config, config_path.as_deref());
    tracing::info!(grpc = %grpc_addr, admin = %admin_addr, "kvroute-ext-proc serving");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "kvroute-ext-proc listening grpc={grpc_addr} admin={admin_addr}"
    );
    let _ = out.flush();
    drop(out);

    let early = tokio::select! {
        r = &mut server => Some(r),
        () = shutdown => None,
    };
    let result = match early {
        Some(r) => r.map_err(Error::Serve),
        None => {
            shared.set_ready(false);
            health
                .set_not_serving::<ExternalProcessorServer<ExtProc>>()
                .await;
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
            let _ = drain_tx.send(());
            match tokio::time::timeout(config.shutdown_grace, &mut server).await {
                Ok(r) => r.map_err(Error::Serve),
                Err(_) => {
                    let open = shared.router.lock().open_tickets();
                    tracing::warn!(
                        open_tickets = open,
                        "shutdown grace period over; exiting with streams open"
                    );
                    Ok(())
                }
            }
        }
    };
    background.stop();
    let open_tickets = shared.router.lock().open_tickets();
    tracing::info!(open_tickets, "kvroute-ext-proc stopped");
    result
}
