//! `kvroute-ext-proc`: flags → configuration → logging → runtime → [`kvroute_ext_proc::run`].

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use kvroute_ext_proc::cli::{Cli, Command};
use kvroute_ext_proc::envoy_config::{self, EnvoyOptions, EnvoyTls};
use kvroute_ext_proc::envoy_module_config::{self, FilterConfig, ModuleOptions};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let source = cli.source();
    let config = match source.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kvroute-ext-proc: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::EnvoyConfig {
        listen,
        admin,
        no_response_headers,
        tls_ca,
        tls_cert,
        tls_key,
        tls_sni,
    }) = cli.command
    {
        let tls = match (config.tls.is_some(), tls_ca) {
            (true, None) => {
                eprintln!("kvroute-ext-proc: the configuration has [listen.tls]: envoy-config needs --tls-ca (and --tls-cert/--tls-key when client_ca is set)");
                return ExitCode::from(2);
            }
            (_, Some(ca)) => Some(EnvoyTls {
                ca,
                client_cert: tls_cert.zip(tls_key),
                sni: tls_sni,
            }),
            (false, None) => None,
        };
        let opts = EnvoyOptions {
            listen,
            admin,
            response_headers: !no_response_headers,
            tls,
        };
        print!("{}", envoy_config::render(&config, &opts));
        return ExitCode::SUCCESS;
    }
    if let Some(Command::EnvoyModuleConfig {
        listen,
        admin,
        inline,
        pods,
    }) = &cli.command
    {
        return print_module_config(&cli, &config, *listen, *admin, *inline, pods.as_deref());
    }
    if matches!(
        config.discovery,
        kvroute_ext_proc::discovery::Discovery::Envoy { .. }
    ) {
        eprintln!(
            "kvroute-ext-proc: {}",
            kvroute_ext_proc::Error::EnvoyDiscovery
        );
        return ExitCode::from(2);
    }
    let filter = match tracing_subscriber::EnvFilter::try_new(&cli.log) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "kvroute-ext-proc: invalid --log / KVROUTE_LOG filter {:?}: {e}",
                cli.log
            );
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();

    // One worker: a current-thread runtime (no cross-thread wake-ups, the cheapest per
    // request); more: the multi-thread scheduler.
    let mut builder = match cli.workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.max(1));
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kvroute-ext-proc: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The signal handlers are installed first, before `run` announces that it listens.
    match runtime.block_on(async {
        let shutdown = kvroute_ext_proc::shutdown::signal();
        kvroute_ext_proc::run(config, source, shutdown).await
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "kvroute-ext-proc failed");
            ExitCode::FAILURE
        }
    }
}

/// `envoy-module-config`: the filter gets --config's path, or with `inline` the file's text.
fn print_module_config(
    cli: &Cli,
    config: &kvroute_ext_proc::config::Config,
    listen: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    inline: bool,
    pods: Option<&str>,
) -> ExitCode {
    use kvroute_ext_proc::envoy_module_config::{check, PodsCluster};
    let pods = match pods.map(PodsCluster::parse).transpose() {
        Ok(p) => p.unwrap_or(PodsCluster::OriginalDst),
        Err(e) => {
            eprintln!("kvroute-ext-proc: --pods {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = check(config, &pods) {
        eprintln!("kvroute-ext-proc: {e}");
        return ExitCode::from(2);
    }
    let Some(path) = &cli.config else {
        eprintln!(
            "kvroute-ext-proc: envoy-module-config needs --config (the module reads the same file)"
        );
        return ExitCode::from(2);
    };
    let filter_config = if inline {
        match std::fs::read_to_string(path) {
            Ok(text) => FilterConfig::Inline(text),
            Err(e) => {
                eprintln!("kvroute-ext-proc: {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    } else {
        FilterConfig::Path(path.display().to_string())
    };
    let opts = ModuleOptions {
        listen,
        admin,
        filter_config,
        pods,
    };
    print!("{}", envoy_module_config::render(config, &opts));
    ExitCode::SUCCESS
}
