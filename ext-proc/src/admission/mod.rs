//! Admission under saturation (`[admission]`): the core's opt-in per-model policy
//! ([`kvroute_core::admission`]) in the ext_proc service, which holds the requests the router
//! queues and answers the ones it sheds.
//!
//! ## Contract
//! - **Off unless configured.** Only models with an `[admission.models."<model>"]` section
//!   (router model names) get a policy ([`kvroute_core::Router::set_admission`]), applied at
//!   start-up and on every reload for the configured models ([`crate::shared::Shared::apply`])
//!   and as discovery adds models; removing the section removes the policy. Without one, a
//!   request is routed exactly as before.
//! - **Priority and tenant** come from the request headers named by `priority_header`
//!   (default `x-kvroute-priority`: an integer or `critical` / `standard` / `sheddable`) and
//!   `tenant_header` (default none: one tenant), else from the GIE objective header
//!   (`x-gateway-inference-objective`) through `[admission.objectives]` (name → priority, as
//!   an `InferenceObjective`'s `priority`); standard when nothing says ([`request`]).
//! - **Routed at once** (below saturation): answered as always. **Shed** at admission
//!   (sheddable and it would wait; queue full): 429 with `Retry-After` at once
//!   ([`crate::respond::Reject::Shed`]).
//! - **Held** (queued): the ext_proc stream withholds its reply to the routing message
//!   ([`crate::stream`], [`crate::service`]) and first asks Envoy to extend that message's
//!   timer (`override_message_timeout`: the queue timeout plus [`config::HOLD_GRACE_MS`],
//!   within the filter's `max_message_timeout`, which the rendered Envoy configuration sets to
//!   [`config::max_message_timeout_secs`]). The request then ends one of three ways:
//!   dispatched (the reply goes out exactly as for a request routed at once), shed (429 with
//!   `Retry-After`: its deadline passed, or it became too late for its target), or its client
//!   left (Envoy ends the side stream: [`Held`]'s drop takes it out of the queue at once).
//! - **Dispatch is pulled** ([`pump`]): a ticket's release, a pod added by discovery, a
//!   reload, a router timer, and each arrival wake the pump, which offers the heads of the
//!   queues in the router's order until one stays queued; so does a [`TICK`] while anything is
//!   held (predictions move with time and engine snapshots). Deadlines are checked at each
//!   pump. The router lock is never held across an await.
//! - **The in-Envoy module cannot hold a request yet** (that would mean resuming Envoy's
//!   stream from the pump): a request the router would queue is taken out of the queue at
//!   once and shed, 429 with reason `would_queue` ([`crate::routing::route_now`]).
//! - Metrics: [`metrics`].

mod config;
mod hold;
pub mod metrics;
pub mod request;

pub use config::{
    max_message_timeout_secs, AdmissionConfig, AdmissionConfigError, AdmissionHeaders,
    AdmissionSection, ModelAdmissionSection, DEFAULT_PRIORITY_HEADER, HOLD_GRACE_MS,
    MAX_QUEUE_TIMEOUT_MS, OBJECTIVE_HEADER,
};
pub use hold::{pump, run, Held, Holds, Verdict, TICK};
pub use request::{attribute_expression, priority_class, AdmissionInputs};

/// Retry-After for a request shed where kvroute cannot hold it (the in-Envoy module), ms.
pub const WOULD_QUEUE_RETRY_AFTER_MS: u64 = 1_000;

/// Sets every router model's policy from `config` (none for a model without a section). The
/// caller then kicks the pump ([`Holds::kick`]): a removed policy lets its queue go at the
/// next offer.
pub fn apply_policies(
    router: &mut kvroute_core::Router,
    config: &AdmissionConfig,
) -> Result<(), kvroute_core::AdmissionPolicyError> {
    for model in router.models() {
        router.set_admission(&model, config.policy(&model))?;
    }
    Ok(())
}
