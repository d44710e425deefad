//! Pod health in kvroute-ext-proc: the `[health]` section, how a response's end as Envoy
//! reports it becomes a [`kvroute_core::Outcome`], and the log line of each health change.
//! The rules themselves (ejection, probes, caps, active checks) are the core's
//! ([`kvroute_core::HealthConfig`]); the active checks are run by the engine scraper.
//!
//! How an outcome is told ([`Outcome`] from [`ResponseEnd`]):
//! - Envoy sends kvroute the response headers of every routed request
//!   (`response_header_mode: SEND`), also those of its own local replies, with the attribute
//!   `response.code_details` (`response_attributes` in the shipped filter config): `via_upstream`
//!   when the pod sent the response; otherwise what Envoy saw, e.g.
//!   `upstream_reset_before_response_started{remote_connection_failure,...}` for a refused
//!   connection (`{connection_timeout}` for one that timed out), `{connection_termination}` when the pod closed the connection without an
//!   answer, `response_timeout` when a route timeout fired.
//! - 1xx–4xx: success (a client error is the client's); 5xx from the pod: failed; Envoy's own
//!   5xx: connect failure, reset or timeout by its details; a local reply that is not about the
//!   pod (overflow of Envoy's own limits, no route): no judgement (reported as cancelled).
//!   Without the attribute (an Envoy config that does not ask for it), every 5xx is failed.
//! - No response headers at all: the client left before the response started (or Envoy's
//!   response-headers phase is SKIP): cancelled, which never counts against a pod.
//! - A reset after the response started cannot be seen here (the side stream ends the same way
//!   as after a normal end); such a request counts as the success its headers said.

use kvroute_core::{
    EjectionReason, HealthConfig, HealthEvent, Outcome, DEFAULT_BASE_EJECTION_MS,
    DEFAULT_MAX_EJECTION_MS,
};
use serde::Deserialize;

/// Default time between two active checks of a pod when engine metrics scraping is off (then
/// kvroute GETs `/health`; with scraping on, each scrape is the check).
pub const DEFAULT_CHECK_INTERVAL_MS: u64 = 1_000;
/// Default path of the active check when scraping is off (vLLM's health endpoint).
pub const DEFAULT_CHECK_PATH: &str = "/health";

/// `[health]`: the core's [`HealthConfig`] field by field (an absent key keeps the core's
/// Envoy-like default), plus the active check used when engine metrics are not scraped.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSection {
    /// Upstream errors in a row that eject a pod (default 5, Envoy's `consecutive_5xx`; 0 = off).
    pub consecutive_5xx: Option<u32>,
    /// Connect failures, resets or timeouts in a row that eject a pod (default 3; 0 = off).
    pub consecutive_gateway_failures: Option<u32>,
    /// First ejection, seconds (default 30, Envoy's `base_ejection_time`); the n-th lasts n
    /// times as long.
    pub base_ejection_secs: Option<f64>,
    /// Longest ejection, seconds (default 300, Envoy's `max_ejection_time`).
    pub max_ejection_secs: Option<f64>,
    /// Most pods of a model ejected at once, percent (default 10, Envoy's; one pod may always
    /// be ejected and one always stays).
    pub max_ejection_percent: Option<u8>,
    /// Failed active checks in a row that take a pod out of service (default 3; 0 = never).
    pub unhealthy_threshold: Option<u32>,
    /// Passed active checks in a row that bring it back (default 1).
    pub healthy_threshold: Option<u32>,
    /// Time between two `GET <check_path>` of each pod when `[engine_metrics]` scraping is off,
    /// ms (default 1,000; 0 = no active checks then).
    pub check_interval_ms: Option<u64>,
    /// The path checked when scraping is off (default `/health`, vLLM's).
    pub check_path: Option<String>,
}

/// Why a `[health]` value was rejected.
#[derive(Debug, thiserror::Error)]
#[error("invalid [health] setting: {0}")]
pub struct HealthSectionError(String);

impl HealthSection {
    /// The core's rules: each present key over [`HealthConfig::default`]. Range checks beyond
    /// the seconds conversion are the core's (`RouterConfig::validate`).
    pub fn to_core(&self) -> Result<HealthConfig, HealthSectionError> {
        let d = HealthConfig::default();
        let ms = |key: &str, secs: Option<f64>, default: u64| match secs {
            None => Ok(default),
            Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok((s * 1_000.0) as u64),
            Some(s) => Err(HealthSectionError(format!(
                "{key} must be in (0, 86400] seconds, got {s}"
            ))),
        };
        Ok(HealthConfig {
            consecutive_5xx: self.consecutive_5xx.unwrap_or(d.consecutive_5xx),
            consecutive_gateway_failures: self
                .consecutive_gateway_failures
                .unwrap_or(d.consecutive_gateway_failures),
            base_ejection_ms: ms(
                "base_ejection_secs",
                self.base_ejection_secs,
                DEFAULT_BASE_EJECTION_MS,
            )?,
            max_ejection_ms: ms(
                "max_ejection_secs",
                self.max_ejection_secs,
                DEFAULT_MAX_EJECTION_MS,
            )?,
            max_ejection_percent: self.max_ejection_percent.unwrap_or(d.max_ejection_percent),
            unhealthy_threshold: self.unhealthy_threshold.unwrap_or(d.unhealthy_threshold),
            healthy_threshold: self.healthy_threshold.unwrap_or(d.healthy_threshold),
        })
    }

    /// The active check used when scraping is off: `(interval, path)`, `None` = off.
    pub fn check(&self) -> Result<Option<(std::time::Duration, String)>, HealthSectionError> {
        let interval = self.check_interval_ms.unwrap_or(DEFAULT_CHECK_INTERVAL_MS);
        let path = self
            .check_path
            .clone()
            .unwrap_or_else(|| DEFAULT_CHECK_PATH.to_owned());
        if !path.starts_with('/') || path.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(HealthSectionError(format!(
                "check_path must be an absolute path of visible ASCII, got {path:?}"
            )));
        }
        Ok((interval > 0).then(|| (std::time::Duration::from_millis(interval), path)))
    }
}

/// What kvroute saw of a response by the time its side stream ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseEnd {
    /// Whether the response-headers message came (else the client left first, or the phase is
    /// off).
    pub headers_seen: bool,
    /// `:status`, when it parsed.
    pub status: Option<u16>,
    /// Envoy's `response.code_details` attribute, when sent.
    pub code_details: Option<String>,
}

impl ResponseEnd {
    /// The outcome the core is told (see the module docs).
    pub fn outcome(&self) -> Outcome {
        if !self.headers_seen {
            return Outcome::Cancelled;
        }
        let Some(status) = self.status else {
            return Outcome::Failed;
        };
        match self.code_details.as_deref() {
            // Sent by the pod (or no attribute): its status says it all.
            None | Some("via_upstream") => {
                if status >= 500 {
                    Outcome::Failed
                } else {
                    Outcome::Success
                }
            }
            Some(details) => local_reply_outcome(status, details),
        }
    }
}

/// The outcome of a reply Envoy made itself, from its code details.
fn local_reply_outcome(status: u16, details: &str) -> Outcome {
    let has = |s: &str| details.contains(s);
    if has("connection_failure") || has("connection_timeout") || has("no_healthy_upstream") {
        Outcome::ConnectFailed
    } else if has("timeout") {
        Outcome::Timeout
    } else if has("overflow") || has("route_not_found") || has("direct_response") {
        // Envoy's own limits or routes: nothing to do with the pod.
        Outcome::Cancelled
    } else if has("upstream_reset") || has("connection_termination") || has("protocol_error") {
        Outcome::Reset
    } else if status >= 500 {
        Outcome::Failed
    } else {
        Outcome::Success
    }
}

/// Logs a health change of `pod` (warn for a pod leaving service, info for one coming back).
pub fn log_event(pod: &str, address: &str, event: HealthEvent, now_ms: u64) {
    match event {
        HealthEvent::Ejected { reason, until, nth } => tracing::warn!(
            pod,
            address,
            reason = reason.as_str(),
            for_secs = until.as_millis().saturating_sub(now_ms) as f64 / 1_000.0,
            nth,
            "pod ejected: no strategy picks it until its ejection is over and a probe request succeeds"
        ),
        HealthEvent::EjectionSkipped { reason } => tracing::warn!(
            pod,
            address,
            reason = reason.as_str(),
            "pod meets an ejection rule but stays in service (max_ejection_percent, or the last pod of a model)"
        ),
        HealthEvent::Readmitted { by } => {
            tracing::info!(pod, address, by = by.as_str(), "pod back in service")
        }
        HealthEvent::ChecksFailing => tracing::warn!(
            pod,
            address,
            "pod's active health checks fail: out of service until one passes"
        ),
        HealthEvent::ChecksPassing => {
            tracing::info!(pod, address, "pod's active health checks pass again")
        }
    }
}

/// Labels of [`EjectionReason::ALL`], for the metrics.
pub fn ejection_reasons() -> impl Iterator<Item = (usize, &'static str)> {
    EjectionReason::ALL
        .iter()
        .enumerate()
        .map(|(i, r)| (i, r.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(status: Option<u16>, details: Option<&str>) -> Outcome {
        ResponseEnd {
            headers_seen: true,
            status,
            code_details: details.map(str::to_owned),
        }
        .outcome()
    }

    #[test]
    fn outcomes_follow_the_status_and_envoys_details() {
        assert_eq!(ResponseEnd::default().outcome(), Outcome::Cancelled);
        assert_eq!(end(Some(200), Some("via_upstream")), Outcome::Success);
        assert_eq!(end(Some(404), Some("via_upstream")), Outcome::Success);
        assert_eq!(end(Some(500), Some("via_upstream")), Outcome::Failed);
        assert_eq!(end(Some(503), None), Outcome::Failed);
        assert_eq!(end(None, None), Outcome::Failed);
        let refused = "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}";
        assert_eq!(end(Some(503), Some(refused)), Outcome::ConnectFailed);
        let closed = "upstream_reset_before_response_started{connection_termination}";
        assert_eq!(end(Some(503), Some(closed)), Outcome::Reset);
        let reset = "upstream_reset_before_response_started{remote_reset}";
        assert_eq!(end(Some(503), Some(reset)), Outcome::Reset);
        assert_eq!(end(Some(504), Some("response_timeout")), Outcome::Timeout);
        let slow_connect = "upstream_reset_before_response_started{connection_timeout}";
        assert_eq!(end(Some(503), Some(slow_connect)), Outcome::ConnectFailed);
        for idle in ["upstream_per_try_idle_timeout", "stream_idle_timeout"] {
            assert_eq!(end(Some(504), Some(idle)), Outcome::Timeout);
        }
        assert_eq!(end(Some(404), Some("route_not_found")), Outcome::Cancelled);
        let overflow = "upstream_reset_before_response_started{overflow}";
        assert_eq!(end(Some(503), Some(overflow)), Outcome::Cancelled);
    }

    #[test]
    fn the_section_maps_onto_the_core_and_rejects_bad_times_and_paths() {
        let s: HealthSection = toml::from_str(
            "consecutive_5xx = 2\nbase_ejection_secs = 0.5\nmax_ejection_percent = 50\ncheck_path = \"/ping\"",
        )
        .unwrap();
        let c = s.to_core().unwrap();
        assert_eq!(c.consecutive_5xx, 2);
        assert_eq!(c.base_ejection_ms, 500);
        assert_eq!(c.max_ejection_ms, DEFAULT_MAX_EJECTION_MS);
        assert_eq!(c.max_ejection_percent, 50);
        let (every, path) = s.check().unwrap().unwrap();
        assert_eq!((every.as_millis(), path.as_str()), (1_000, "/ping"));
        let bad = |text: &str| {
            let s: HealthSection = toml::from_str(text).unwrap();
            s.to_core().is_err() || s.check().is_err()
        };
        assert!(bad("base_ejection_secs = 0"));
        assert!(bad("max_ejection_secs = -1"));
        assert!(bad("check_path = \"health\""));
        assert!(bad("check_path = \"/a b\""));
        let off: HealthSection = toml::from_str("check_interval_ms = 0").unwrap();
        assert_eq!(off.check().unwrap(), None);
    }
}
