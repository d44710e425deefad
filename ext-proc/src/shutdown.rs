//! The shutdown signal: SIGTERM (what Kubernetes sends) or SIGINT (Ctrl-C for developers).

/// Completes on the first SIGTERM or SIGINT. If the handlers cannot be installed, logs it
/// and waits for Ctrl-C only.
pub async fn signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
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
