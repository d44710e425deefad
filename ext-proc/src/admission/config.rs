//! `[admission]`: the headers a request's priority and tenant come from, GIE objective names,
//! and `[admission.models."<model>"]`, one [`AdmissionPolicy`] per router model.

use std::collections::BTreeMap;

use kvroute_core::{AdmissionPolicy, AdmissionPolicyError};
use serde::Deserialize;

/// Default `priority_header` (the simulator's name too).
pub const DEFAULT_PRIORITY_HEADER: &str = "x-kvroute-priority";
/// The Gateway API Inference Extension's objective header: it names an `InferenceObjective`,
/// whose `priority` `[admission.objectives]` gives.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// The longest `queue_timeout_ms`: Envoy's `max_message_timeout`, rendered from it
/// ([`max_message_timeout_secs`]), must cover every hold, and Envoy's default stream idle
/// timeout (5 minutes) must not cut a held request.
pub const MAX_QUEUE_TIMEOUT_MS: u64 = 120_000;
/// What kvroute asks Envoy to wait beyond a held request's queue timeout
/// ([`crate::admission::Held::message_timeout`]): the deadline is answered within it.
pub const HOLD_GRACE_MS: u64 = 1_000;

/// Envoy's `max_message_timeout` in seconds: the longest hold plus its grace, so that every
/// `override_message_timeout` kvroute sends is within it.
pub fn max_message_timeout_secs() -> u64 {
    (MAX_QUEUE_TIMEOUT_MS + HOLD_GRACE_MS).div_ceil(1_000)
}

/// `[admission]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSection {
    /// The header carrying a request's priority: an integer or `critical` / `standard` /
    /// `sheddable` (default `x-kvroute-priority`).
    pub priority_header: Option<String>,
    /// The header naming a request's tenant (default none: every request is one tenant's).
    pub tenant_header: Option<String>,
    /// GIE `InferenceObjective` names → their priority, read from
    /// `x-gateway-inference-objective` (default none: the header is not read).
    #[serde(default)]
    pub objectives: BTreeMap<String, i32>,
    /// `[admission.models."<model>"]`: the models whose requests are held or shed when
    /// saturated, by router model name.
    #[serde(default)]
    pub models: BTreeMap<String, ModelAdmissionSection>,
}

/// `[admission.models."<model>"]` as written: [`AdmissionPolicy`] key by key, absent keys the
/// core's defaults, except the target, which is required.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelAdmissionSection {
    /// The TTFT target, ms.
    pub ttft_target_ms: u32,
    /// Requests held at most (default 256).
    pub max_queue: Option<u32>,
    /// Longest hold, ms (default 30,000; at most [`MAX_QUEUE_TIMEOUT_MS`]).
    pub queue_timeout_ms: Option<u64>,
    /// Waiting requests at which a fresh engine snapshot says a pod has no room (default 5,
    /// llm-d's; 0 = off).
    pub queue_depth_threshold: Option<u32>,
    /// KV-cache usage at which a fresh engine snapshot says a pod has no room (default 0.8).
    pub kv_usage_threshold: Option<f64>,
}

/// How a request's priority and tenant are read: the headers (lower-case names) and the
/// objectives' priorities.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionHeaders {
    /// The priority header.
    pub priority: String,
    /// The tenant header, if any.
    pub tenant: Option<String>,
    /// Objective name → priority; `x-gateway-inference-objective` is read when not empty.
    pub objectives: BTreeMap<String, i32>,
}

impl Default for AdmissionHeaders {
    fn default() -> Self {
        AdmissionHeaders {
            priority: DEFAULT_PRIORITY_HEADER.to_owned(),
            tenant: None,
            objectives: BTreeMap::new(),
        }
    }
}

impl AdmissionHeaders {
    /// Every header name read, in a fixed order: priority, tenant, objective.
    pub fn names(&self) -> Vec<&str> {
        let mut names = vec![self.priority.as_str()];
        names.extend(self.tenant.as_deref());
        if !self.objectives.is_empty() {
            names.push(OBJECTIVE_HEADER);
        }
        names
    }
}

/// A validated `[admission]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdmissionConfig {
    /// How requests' priorities and tenants are read.
    pub headers: AdmissionHeaders,
    /// Router model → its policy.
    pub policies: BTreeMap<String, AdmissionPolicy>,
}

impl AdmissionConfig {
    /// Whether any model has a policy (else admission is off: every request is routed as
    /// before, and nothing is rendered for it in Envoy's configuration).
    pub fn is_on(&self) -> bool {
        !self.policies.is_empty()
    }

    /// `model`'s policy, if it has one.
    pub fn policy(&self, model: &str) -> Option<AdmissionPolicy> {
        self.policies.get(model).copied()
    }
}

/// Why `[admission]` was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionConfigError {
    /// A header name that is not a lower-case HTTP token (`a-z`, `0-9`, `-`, `_`, `.`).
    #[error(
        "[admission] {key} {name:?}: a header name is lower-case letters, digits, '-', '_' or '.'"
    )]
    HeaderName {
        /// `priority_header` or `tenant_header`.
        key: &'static str,
        /// The name given.
        name: String,
    },
    /// The priority and tenant headers are the same.
    #[error("[admission] priority_header and tenant_header are both {0:?}")]
    SameHeader(String),
    /// An empty objective name.
    #[error("[admission.objectives]: an objective name is empty")]
    EmptyObjective,
    /// A policy for a model that is not configured (static pods).
    #[error("[admission.models.\"{0}\"]: {0:?} is not a configured model")]
    UnknownModel(String),
    /// A queue timeout over [`MAX_QUEUE_TIMEOUT_MS`].
    #[error("[admission.models.\"{model}\"] queue_timeout_ms {ms} is over {MAX_QUEUE_TIMEOUT_MS}")]
    QueueTimeout {
        /// The model.
        model: String,
        /// The value given.
        ms: u64,
    },
    /// A value the core refuses.
    #[error("[admission.models.\"{model}\"]: {source}")]
    Policy {
        /// The model.
        model: String,
        /// The core's reason.
        source: AdmissionPolicyError,
    },
}

fn header_name(key: &'static str, name: &str) -> Result<String, AdmissionConfigError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(name.to_owned())
    } else {
        Err(AdmissionConfigError::HeaderName {
            key,
            name: name.to_owned(),
        })
    }
}

impl ModelAdmissionSection {
    /// The core's policy for `model`, validated.
    pub fn to_policy(&self, model: &str) -> Result<AdmissionPolicy, AdmissionConfigError> {
        let d = AdmissionPolicy::default();
        let policy = AdmissionPolicy {
            ttft_target_ms: self.ttft_target_ms,
            max_queue: self.max_queue.unwrap_or(d.max_queue),
            queue_timeout_ms: self.queue_timeout_ms.unwrap_or(d.queue_timeout_ms),
            queue_depth_threshold: self
                .queue_depth_threshold
                .unwrap_or(d.queue_depth_threshold),
            kv_usage_threshold: self.kv_usage_threshold.unwrap_or(d.kv_usage_threshold),
        };
        policy
            .validate()
            .map_err(|source| AdmissionConfigError::Policy {
                model: model.to_owned(),
                source,
            })?;
        if policy.queue_timeout_ms > MAX_QUEUE_TIMEOUT_MS {
            return Err(AdmissionConfigError::QueueTimeout {
                model: model.to_owned(),
                ms: policy.queue_timeout_ms,
            });
        }
        Ok(policy)
    }
}

impl AdmissionSection {
    /// Validates the section. With static pods (`static_models`: the configured models) a
    /// policy must name a configured model; under discovery any name is accepted (it applies
    /// when a model of that name appears: an AIBrix model label, or the InferencePool's name).
    pub fn build(
        &self,
        static_models: Option<&BTreeMap<String, Vec<crate::config::PodEntry>>>,
    ) -> Result<AdmissionConfig, AdmissionConfigError> {
        let priority = match &self.priority_header {
            Some(n) => header_name("priority_header", n)?,
            None => DEFAULT_PRIORITY_HEADER.to_owned(),
        };
        let tenant = match &self.tenant_header {
            Some(n) => Some(header_name("tenant_header", n)?),
            None => None,
        };
        if tenant.as_deref() == Some(priority.as_str()) {
            return Err(AdmissionConfigError::SameHeader(priority));
        }
        if self.objectives.keys().any(String::is_empty) {
            return Err(AdmissionConfigError::EmptyObjective);
        }
        let mut policies = BTreeMap::new();
        for (model, section) in &self.models {
            if static_models.is_some_and(|m| !m.contains_key(model)) {
                return Err(AdmissionConfigError::UnknownModel(model.clone()));
            }
            policies.insert(model.clone(), section.to_policy(model)?);
        }
        Ok(AdmissionConfig {
            headers: AdmissionHeaders {
                priority,
                tenant,
                objectives: self.objectives.clone(),
            },
            policies,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> AdmissionSection {
        #[derive(Deserialize)]
        struct File {
            admission: AdmissionSection,
        }
        toml::from_str::<File>(text).unwrap().admission
    }

    fn models(names: &[&str]) -> BTreeMap<String, Vec<crate::config::PodEntry>> {
        names
            .iter()
            .map(|n| ((*n).to_owned(), Vec::new()))
            .collect()
    }

    #[test]
    fn a_model_section_is_the_cores_policy_with_its_defaults() {
        let c = section("[admission.models.m]\nttft_target_ms = 1500")
            .build(Some(&models(&["m"])))
            .unwrap();
        assert!(c.is_on());
        let p = c.policy("m").unwrap();
        assert_eq!(
            p,
            AdmissionPolicy {
                ttft_target_ms: 1_500,
                ..AdmissionPolicy::default()
            }
        );
        assert_eq!((p.max_queue, p.queue_timeout_ms), (256, 30_000));
        assert_eq!((p.queue_depth_threshold, p.kv_usage_threshold), (5, 0.8));
        assert_eq!(c.policy("other"), None);
        assert_eq!(c.headers, AdmissionHeaders::default());
        assert_eq!(c.headers.names(), ["x-kvroute-priority"]);

        let text = "[admission]\npriority_header = \"x-prio\"\ntenant_header = \"x-gateway-inference-fairness-id\"\n\
                    [admission.objectives]\npremium = 10\nbatch = -1\n\
                    [admission.models.\"org/m\"]\nttft_target_ms = 800\nmax_queue = 4\nqueue_timeout_ms = 5000\nqueue_depth_threshold = 0\nkv_usage_threshold = 0.95";
        let c = section(text).build(None).unwrap();
        let p = c.policy("org/m").unwrap();
        assert_eq!(
            (p.max_queue, p.queue_timeout_ms, p.queue_depth_threshold),
            (4, 5_000, 0)
        );
        assert_eq!(p.kv_usage_threshold, 0.95);
        assert_eq!(
            c.headers.names(),
            [
                "x-prio",
                "x-gateway-inference-fairness-id",
                "x-gateway-inference-objective"
            ]
        );
        assert_eq!(c.headers.objectives["batch"], -1);
    }

    #[test]
    fn no_section_is_off() {
        let c = AdmissionSection::default().build(None).unwrap();
        assert!(!c.is_on());
        assert_eq!(c, AdmissionConfig::default());
    }

    #[test]
    fn bad_sections_are_refused_with_their_reason() {
        let err = |text: &str| section(text).build(Some(&models(&["m"]))).expect_err(text);
        assert_eq!(
            err("[admission.models.x]\nttft_target_ms = 1"),
            AdmissionConfigError::UnknownModel("x".into())
        );
        assert!(matches!(
            err("[admission.models.m]\nttft_target_ms = 0"),
            AdmissionConfigError::Policy { .. }
        ));
        assert!(matches!(
            err("[admission.models.m]\nttft_target_ms = 1\nqueue_timeout_ms = 0"),
            AdmissionConfigError::Policy { .. }
        ));
        assert!(matches!(
            err("[admission.models.m]\nttft_target_ms = 1\nkv_usage_threshold = 0.0"),
            AdmissionConfigError::Policy { .. }
        ));
        assert_eq!(
            err("[admission.models.m]\nttft_target_ms = 1\nqueue_timeout_ms = 120001"),
            AdmissionConfigError::QueueTimeout {
                model: "m".into(),
                ms: 120_001
            }
        );
        for bad in ["X-Prio", "", "a b", "x\"y"] {
            let text = format!("[admission]\npriority_header = {bad:?}");
            assert!(
                matches!(err(&text), AdmissionConfigError::HeaderName { .. }),
                "{bad:?}"
            );
        }
        assert_eq!(
            err("[admission]\ntenant_header = \"x-kvroute-priority\""),
            AdmissionConfigError::SameHeader("x-kvroute-priority".into())
        );
        assert_eq!(
            err("[admission.objectives]\n\"\" = 1"),
            AdmissionConfigError::EmptyObjective
        );
        // A missing target and unknown keys are TOML errors.
        for text in [
            "[admission.models.m]\nmax_queue = 1",
            "[admission.models.m]\nttft_target_ms = 1\nbogus = 1",
            "[admission]\nbogus = 1",
        ] {
            #[derive(Debug, Deserialize)]
            #[allow(dead_code)]
            struct File {
                admission: AdmissionSection,
            }
            assert!(toml::from_str::<File>(text).is_err(), "{text}");
        }
    }

    #[test]
    fn envoys_timer_covers_the_longest_hold() {
        assert!(max_message_timeout_secs() * 1_000 >= MAX_QUEUE_TIMEOUT_MS + HOLD_GRACE_MS);
        assert_eq!(max_message_timeout_secs(), 121);
    }
}
