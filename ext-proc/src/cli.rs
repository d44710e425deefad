//! Command-line flags (clap). Flags win over the environment and the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{ConfigSource, Overrides};
use crate::env::EnvSnapshot;

/// kvroute's Envoy external-processing service.
#[derive(Clone, Debug, Parser)]
#[command(name = "kvroute-ext-proc", version, about)]
pub struct Cli {
    /// TOML configuration file (reloaded on SIGHUP and on change). Accepted before or after
    /// the subcommand.
    #[arg(long, short = 'c', env = "KVROUTE_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// ext_proc + gRPC health listen address (port 0 = any free port).
    #[arg(long)]
    pub grpc_listen: Option<SocketAddr>,
    /// Admin HTTP listen address (/metrics, /healthz, /readyz).
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// Default routing strategy (wins over ROUTING_ALGORITHM).
    #[arg(long)]
    pub default_strategy: Option<String>,
    /// Largest request body routed; larger ones get 413.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Seconds in-flight streams get after SIGTERM.
    #[arg(long)]
    pub shutdown_grace_secs: Option<u64>,
    /// PRNG seed (random per process by default).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Start (and reload) even when no model is configured (every request then gets 400).
    #[arg(long)]
    pub allow_no_models: bool,
    /// Tokio worker threads (default: one per CPU; 1 = a single-threaded runtime).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Log filter (tracing-subscriber EnvFilter syntax).
    #[arg(long, env = "KVROUTE_LOG", default_value = "info")]
    pub log: String,
    /// Something else than serving.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Clone, Debug, Subcommand)]
pub enum Command {
    /// Print an Envoy config (envoy/envoy.template.yaml) for this kvroute configuration.
    EnvoyConfig {
        /// Envoy's client listener.
        #[arg(long, default_value = "127.0.0.1:10000")]
        listen: SocketAddr,
        /// Envoy's admin listener.
        #[arg(long, default_value = "127.0.0.1:9901")]
        admin: SocketAddr,
        /// Turn the response-headers phase off (no target-pod & co. to clients; cheaper).
        #[arg(long)]
        no_response_headers: bool,
        /// TLS to kvroute: the CA file (as Envoy sees it) that signed kvroute's certificate.
        /// Required when the configuration has [listen.tls].
        #[arg(long)]
        tls_ca: Option<String>,
        /// Envoy's client certificate chain, when kvroute requires one (client_ca).
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<String>,
        /// The key of --tls-cert.
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<String>,
        /// The server name Envoy sends to kvroute (SNI).
        #[arg(long, default_value = "kvroute-ext-proc")]
        tls_sni: String,
    },
    /// Print an Envoy config with kvroute inside it, as the dynamic module libkvroute_envoy.so
    /// (envoy/envoy.module.template.yaml), for this kvroute configuration.
    EnvoyModuleConfig {
        /// Envoy's client listener.
        #[arg(long, default_value = "127.0.0.1:10000")]
        listen: SocketAddr,
        /// Envoy's admin listener.
        #[arg(long, default_value = "127.0.0.1:9901")]
        admin: SocketAddr,
        /// Put the TOML's text into Envoy's config instead of its path (--config's path, as
        /// given: it must be valid where Envoy runs).
        #[arg(long)]
        inline: bool,
        /// The pods as Envoy's own cluster (for `[discovery] source = "envoy"`):
        /// static:IP:PORT[,IP:PORT...] or dns:HOST:PORT (a headless Service). Envoy's health
        /// checks and outlier detection then decide which pods kvroute may pick.
        #[arg(long, value_name = "static:...|dns:HOST:PORT")]
        pods: Option<String>,
    },
}

impl Cli {
    /// The configuration source these flags describe (env read now, seed drawn now).
    pub fn source(&self) -> ConfigSource {
        let mut seed = [0u8; 8];
        // Without OS randomness fall back to the time; routing stays correct either way.
        if getrandom::fill(&mut seed).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            seed = (t.as_nanos() as u64).to_le_bytes();
        }
        ConfigSource {
            path: self.config.clone(),
            env: EnvSnapshot::from_process(),
            overrides: Overrides {
                grpc_listen: self.grpc_listen,
                admin_listen: self.admin_listen,
                default_strategy: self.default_strategy.clone(),
                max_body_bytes: self.max_body_bytes,
                shutdown_grace_secs: self.shutdown_grace_secs,
                seed: self.seed,
                allow_no_models: self.allow_no_models,
            },
            process_seed: u64::from_le_bytes(seed),
        }
    }
}
