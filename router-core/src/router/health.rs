//! Pod health through the router: what a completion's outcome and an active check do to a
//! pod ([`crate::health`] holds the rules; this applies them with the model-level caps).

use super::Router;
use crate::health::{HealthEvent, Readmission, Verdict};
use crate::ids::{PodId, Ticket};
use crate::registry::RegistryError;
use crate::tickets::Outcome;
use crate::time::Timestamp;

impl Router {
    /// Applies the outcome of `ticket` to the health of `pod` (live): ejection within the
    /// models' caps, probe results.
    pub(super) fn judge(
        &mut self,
        pod: PodId,
        ticket: Ticket,
        outcome: Outcome,
        now: Timestamp,
    ) -> Option<HealthEvent> {
        let cfg = self.config.health;
        let verdict = self.registry.pods[pod.index()]
            .health
            .on_outcome(ticket, outcome, &cfg);
        let health = &mut self.registry.pods[pod.index()].health;
        match verdict {
            Verdict::Nothing => None,
            Verdict::Readmitted => Some(health.readmit(Readmission::Probe, now)),
            Verdict::Reeject(reason) => Some(health.eject(reason, now, &cfg)),
            Verdict::Eject(reason) => {
                if self.may_eject(pod) {
                    let health = &mut self.registry.pods[pod.index()].health;
                    Some(health.eject(reason, now, &cfg))
                } else {
                    self.registry.pods[pod.index()].health.reset_counts();
                    Some(HealthEvent::EjectionSkipped { reason })
                }
            }
        }
    }

    /// Whether ejecting `pod` keeps every model it serves within
    /// [`crate::HealthConfig::max_ejection_percent`] and with another pod in service (ready,
    /// not ejected, checks passing).
    fn may_eject(&self, pod: PodId) -> bool {
        let reg = &self.registry;
        reg.pods[pod.index()].models.iter().all(|m| {
            let pods = &reg.models[m.index()].pods;
            let (mut ejected, mut others_in_service) = (0, 0);
            for &p in pods {
                let h = &reg.pods[p.index()].health;
                if h.is_ejected() {
                    ejected += 1;
                } else if p != pod && reg.pods[p.index()].ready && h.in_service() {
                    others_in_service += 1;
                }
            }
            others_in_service > 0 && ejected < self.config.health.max_ejected(pods.len())
        })
    }

    /// Reports an active health check of `pod` (a scrape of its engine's `/metrics` or a
    /// `GET /health`) that passed or failed at `now`. Failing checks take the pod out of
    /// service; a passing one after failures can end an ejection for gateway failures (see
    /// [`crate::HealthConfig`]). Returns what changed.
    pub fn report_health_check(
        &mut self,
        pod: PodId,
        passed: bool,
        now: Timestamp,
    ) -> Result<Option<HealthEvent>, RegistryError> {
        let now = self.clock(now);
        let cfg = self.config.health;
        Ok(self
            .registry
            .pod_mut(pod)?
            .health
            .on_check(passed, now, &cfg))
    }
}
