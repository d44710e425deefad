//! Fault injection for the fake server: a [`FaultSpec`] set at start-up (`--fault-*` flags) or
//! at run time (`POST /fault`), and the per-request decisions it gives.
//!
//! ## Contract
//! - A spec selects requests and says what happens to a selected one:
//!   - the targets are `/v1/completions`, `/v1/chat/completions` and `/v1/models` (they share
//!     one request counter), and with `health` also `/health` and `/metrics`; no other path
//!     is ever faulted (`/fault` and `/reset_prefix_cache` stay usable);
//!   - the first `after` target requests after the spec was set pass untouched; of the later
//!     ones, the `j`-th (`j` = 1, 2, ...) is selected when `⌊j·rate⌋ > ⌊(j−1)·rate⌋`: exactly
//!     `⌊j·rate⌋` of the first `j` are selected, evenly spread (rate 1 = every one, 0.5 = the
//!     2nd, 4th, ..., 0 = none). Deterministic: no randomness;
//!   - `/health` and `/metrics` (with `health`) are selected whenever `after` target requests
//!     have passed (at once when `after` is 0); `rate` does not apply to them and they do not
//!     count;
//!   - a selected request is first read whole, then waits `stall_ms` (nothing is sent), then:
//!     with `close` the connection is dropped without a response; else with a `status` it is
//!     answered with that status and an OpenAI-style error body; else it proceeds normally.
//!     A spec with neither `close` nor `stall_ms` fails with `status`, default 500.
//! - A faulted request never reaches the engine (no engine work, no cached blocks), unless it
//!   is a stall without a status, which then proceeds as any request.
//! - Setting a spec (even the same one) restarts its request counter; `{}` clears it.
//! - Every injected fault is counted by kind (a stall that ends in a status counts both).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest stall a spec may ask for, ms (one hour).
pub const MAX_STALL_MS: u64 = 3_600_000;

/// A fault spec as written (`POST /fault` body, or the `--fault-*` flags): every field optional,
/// unknown fields refused. [`FaultRequest::into_spec`] validates and normalises it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRequest {
    /// Status of failed requests, 400–599 (default 500 when the spec fails requests).
    pub status: Option<u16>,
    /// Fraction of target requests (after `after`) selected, 0.0–1.0 (default 1.0).
    pub rate: Option<f64>,
    /// Target requests let through before any is selected (default 0).
    pub after: Option<u64>,
    /// Delay before a selected request's response (or close), ms (default 0).
    pub stall_ms: Option<u64>,
    /// Drop the connection without a response (excludes `status`).
    pub close: Option<bool>,
    /// Fault `/health` and `/metrics` too.
    pub health: Option<bool>,
}

/// A validated fault spec. Serialises without its default fields, so `GET /fault` returns what
/// `POST /fault` takes back unchanged, and no fault is `{}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultSpec {
    /// Status of failed requests; `None` when selected requests are not failed with a status
    /// (a plain stall, or `close`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Fraction of target requests (after `after`) selected.
    #[serde(skip_serializing_if = "is_one")]
    pub rate: f64,
    /// Target requests let through before any is selected.
    #[serde(skip_serializing_if = "is_zero")]
    pub after: u64,
    /// Delay before a selected request's response (or close), ms.
    #[serde(skip_serializing_if = "is_zero")]
    pub stall_ms: u64,
    /// Drop the connection of a selected request without a response.
    #[serde(skip_serializing_if = "is_false")]
    pub close: bool,
    /// Fault `/health` and `/metrics` too.
    #[serde(skip_serializing_if = "is_false")]
    pub health: bool,
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

fn is_false(x: &bool) -> bool {
    !*x
}

impl Default for FaultSpec {
    /// No fault.
    fn default() -> Self {
        FaultSpec {
            status: None,
            rate: 1.0,
            after: 0,
            stall_ms: 0,
            close: false,
            health: false,
        }
    }
}

impl FaultSpec {
    /// Whether the spec does anything.
    pub fn is_active(&self) -> bool {
        self.status.is_some() || self.stall_ms > 0 || self.close
    }

    /// Parses and validates a `POST /fault` body. The error names the problem.
    pub fn from_json(body: &[u8]) -> Result<FaultSpec, String> {
        let req: FaultRequest =
            serde_json::from_slice(body).map_err(|e| format!("invalid fault spec: {e}"))?;
        req.into_spec()
    }
}

impl FaultRequest {
    /// Validates the spec: `status` 400–599, `rate` 0–1, `stall_ms` ≤ [`MAX_STALL_MS`], no
    /// `status` with `close`. A spec that selects requests (`rate`, `after` or `health` given)
    /// but neither stalls nor closes fails them with `status` 500 unless told otherwise; one that
    /// does nothing is no fault.
    pub fn into_spec(self) -> Result<FaultSpec, String> {
        if let Some(s) = self.status {
            if !(400..=599).contains(&s) {
                return Err(format!(
                    "fault `status` must be between 400 and 599, got {s}"
                ));
            }
        }
        if let Some(r) = self.rate {
            if !(r.is_finite() && (0.0..=1.0).contains(&r)) {
                return Err(format!("fault `rate` must be between 0.0 and 1.0, got {r}"));
            }
        }
        let stall_ms = self.stall_ms.unwrap_or(0);
        if stall_ms > MAX_STALL_MS {
            return Err(format!(
                "fault `stall_ms` must be at most {MAX_STALL_MS}, got {stall_ms}"
            ));
        }
        let close = self.close.unwrap_or(false);
        if close && self.status.is_some() {
            return Err("fault `close` sends no response, so it takes no `status`".into());
        }
        let health = self.health.unwrap_or(false);
        let selects = self.rate.is_some() || self.after.is_some() || health;
        let status = match self.status {
            Some(s) => Some(s),
            None if !close && stall_ms == 0 && selects => Some(500),
            None => None,
        };
        let spec = FaultSpec {
            status,
            rate: self.rate.unwrap_or(1.0),
            after: self.after.unwrap_or(0),
            stall_ms,
            close,
            health,
        };
        Ok(if spec.is_active() {
            spec
        } else {
            FaultSpec::default()
        })
    }
}

/// Which requests a spec can fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `/v1/completions`, `/v1/chat/completions`, `/v1/models`.
    Inference,
    /// `/health`, `/metrics` (only with `health`).
    Health,
}

impl Target {
    /// The target a path is, if any.
    pub fn of_path(path: &str) -> Option<Target> {
        match path {
            "/v1/completions" | "/v1/chat/completions" | "/v1/models" => Some(Target::Inference),
            "/health" | "/metrics" => Some(Target::Health),
            _ => None,
        }
    }
}

/// What happens to a selected request after its stall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// It is served normally.
    Proceed,
    /// It is answered with this status and an error body.
    Status(u16),
    /// Its connection is dropped without a response.
    Close,
}

/// The fault one request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Delay before anything else (zero: none).
    pub stall: Duration,
    /// Then.
    pub then: Then,
}

/// The kinds of injected fault counted in `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A status answer (spec or `x-sim-status`).
    Status,
    /// A stall.
    Stall,
    /// A dropped connection.
    Close,
}

impl FaultKind {
    /// Every kind, in `/metrics` order.
    pub const ALL: [FaultKind; 3] = [FaultKind::Status, FaultKind::Stall, FaultKind::Close];

    /// The `kind` label.
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Status => "status",
            FaultKind::Stall => "stall",
            FaultKind::Close => "close",
        }
    }
}

struct Current {
    spec: FaultSpec,
    /// Target (inference) requests seen since the spec was set.
    seen: u64,
}

/// The server's fault state: the current spec, its request counter, and the injected counts.
pub struct Faults {
    current: Mutex<Current>,
    injected: [AtomicU64; 3],
}

impl Faults {
    /// Starts with `spec`.
    pub fn new(spec: FaultSpec) -> Faults {
        Faults {
            current: Mutex::new(Current { spec, seen: 0 }),
            injected: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current spec.
    pub fn spec(&self) -> FaultSpec {
        self.lock().spec.clone()
    }

    /// Replaces the spec and restarts its request counter.
    pub fn set(&self, spec: FaultSpec) {
        *self.lock() = Current { spec, seen: 0 };
    }

    /// Counts a request to `target` and says what fault, if any, it gets.
    pub fn decide(&self, target: Target) -> Option<Fault> {
        let mut cur = self.lock();
        let selected = match target {
            Target::Inference => {
                cur.seen += 1;
                let spec = &cur.spec;
                let j = cur.seen.checked_sub(spec.after).filter(|j| *j > 0);
                spec.is_active()
                    && j.is_some_and(|j| {
                        (j as f64 * spec.rate).floor() > ((j - 1) as f64 * spec.rate).floor()
                    })
            }
            Target::Health => cur.spec.health && cur.spec.is_active() && cur.seen >= cur.spec.after,
        };
        if !selected {
            return None;
        }
        let spec = &cur.spec;
        let then = if spec.close {
            Then::Close
        } else {
            spec.status.map_or(Then::Proceed, Then::Status)
        };
        Some(Fault {
            stall: Duration::from_millis(spec.stall_ms),
            then,
        })
    }

    /// Counts one injected fault.
    pub fn record(&self, kind: FaultKind) {
        self.injected[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Faults injected so far, by kind (in [`FaultKind::ALL`] order).
    pub fn injected(&self) -> [(FaultKind, u64); 3] {
        FaultKind::ALL.map(|k| (k, self.injected[k as usize].load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<FaultSpec, String> {
        FaultSpec::from_json(json.as_bytes())
    }

    fn pattern(f: &Faults, n: usize) -> String {
        (0..n)
            .map(|_| match f.decide(Target::Inference) {
                None => '.',
                Some(Fault {
                    then: Then::Status(_),
                    ..
                }) => 'x',
                Some(_) => '?',
            })
            .collect()
    }

    #[test]
    fn specs_normalise_and_round_trip() {
        for (input, output) in [
            (r#"{}"#, r#"{}"#),
            (r#"{"status":500,"rate":1.0}"#, r#"{"status":500}"#),
            (r#"{"rate":0.5}"#, r#"{"status":500,"rate":0.5}"#),
            (
                r#"{"after":10,"status":503}"#,
                r#"{"status":503,"after":10}"#,
            ),
            (r#"{"stall_ms":3000}"#, r#"{"stall_ms":3000}"#),
            (r#"{"close":true}"#, r#"{"close":true}"#),
            (r#"{"health":true}"#, r#"{"status":500,"health":true}"#),
            (r#"{"close":false,"stall_ms":0}"#, r#"{}"#),
            (
                r#"{"stall_ms":100,"status":504,"rate":0.25}"#,
                r#"{"status":504,"rate":0.25,"stall_ms":100}"#,
            ),
        ] {
            let s = spec(input).unwrap();
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(text, output, "{input}");
            assert_eq!(spec(&text).unwrap(), s, "{input} round trip");
        }
    }

    #[test]
    fn bad_specs_are_refused() {
        for input in [
            r#"{"status":200}"#,
            r#"{"status":600}"#,
            r#"{"status":"500"}"#,
            r#"{"rate":1.5}"#,
            r#"{"rate":-0.1}"#,
            r#"{"after":-1}"#,
            r#"{"stall_ms":3600001}"#,
            r#"{"close":true,"status":500}"#,
            r#"{"stall":100}"#,
            r#"[]"#,
            r#"not json"#,
            r#""#,
        ] {
            assert!(spec(input).is_err(), "{input}");
        }
    }

    #[test]
    fn selection_is_counter_based() {
        let f = Faults::new(spec(r#"{"rate":0.5}"#).unwrap());
        assert_eq!(pattern(&f, 6), ".x.x.x");
        f.set(spec(r#"{"after":3,"status":503}"#).unwrap());
        assert_eq!(pattern(&f, 6), "...xxx");
        f.set(spec(r#"{"after":2,"rate":0.25}"#).unwrap());
        assert_eq!(pattern(&f, 10), ".....x...x");
        f.set(spec(r#"{"rate":0}"#).unwrap());
        assert_eq!(pattern(&f, 5), ".....");
        f.set(FaultSpec::default());
        assert_eq!(pattern(&f, 3), "...");
    }

    #[test]
    fn health_fails_once_after_requests_have_passed() {
        let f = Faults::new(spec(r#"{"after":1,"status":502,"health":true}"#).unwrap());
        assert_eq!(f.decide(Target::Health), None);
        assert_eq!(f.decide(Target::Inference), None);
        let fail = Some(Fault {
            stall: Duration::ZERO,
            then: Then::Status(502),
        });
        assert_eq!(f.decide(Target::Health), fail);
        assert_eq!(f.decide(Target::Inference), fail);
        f.set(spec(r#"{"status":502}"#).unwrap());
        assert_eq!(f.decide(Target::Health), None);
        f.set(spec(r#"{"close":true,"stall_ms":5,"health":true}"#).unwrap());
        assert_eq!(
            f.decide(Target::Health),
            Some(Fault {
                stall: Duration::from_millis(5),
                then: Then::Close
            })
        );
    }
}
