//! The shutdown signal: SIGTERM (what Kubernetes sends) or SIGINT (Ctrl-C for developers).

use std::future::Future;

/// Installs the SIGTERM and SIGINT handlers now and returns a future that completes on the
/// first of them. Call it before announcing readiness: until the handlers are installed a
/// SIGTERM kills the process at once, without the drain. If they cannot be installed, logs it
/// and the future waits for Ctrl-C only. Must be called within a Tokio runtime.
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
                    _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
                }
            }
            _ => {
                tracing::error!("cannot install SIGTERM/SIGINT handlers; waiting for Ctrl-C");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
