//! The router's timers: sleep until [`kvroute_core::Router::poll_timeout`] (at most one
//! second, since routing can move it earlier), then call `handle_timeout(now)`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::shared::Shared;

/// Longest sleep between two checks.
pub const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Runs until `stop` changes.
pub async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let next = shared.router.lock().poll_timeout();
        let now = shared.now();
        let wait = next.map_or(MAX_SLEEP, |t| {
            Duration::from_millis(t.millis_since(now)).min(MAX_SLEEP)
        });
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        let now = shared.now();
        shared.router.lock().handle_timeout(now);
        // Tickets expired, pods readmitted: capacity for the held requests.
        shared.holds.kick();
    }
}
