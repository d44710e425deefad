//! Admission under saturation (see [`crate::admission`] for the contract): `admit`, the queue's
//! pull-driven dispatch, cancels and deadlines.

use super::{JobSize, RouteError, RouteRequest, Router};
use crate::admission::{
    self, AdmissionPolicy, AdmissionPolicyError, AdmissionStats, Admitted, PodRoom, QueueId, Shed,
    ShedReason,
};
use crate::registry::RegistryError;
use crate::strategy::Strategy;
use crate::time::Timestamp;

/// Retry-After for a request shed at its deadline or for a full queue while nothing predicts
/// better.
const DEFAULT_RETRY_AFTER_MS: u64 = 1_000;

impl Router {
    /// Sets (or with `None` removes) `model`'s admission policy. Requests already queued stay
    /// queued; without a policy they dispatch at the next [`Router::dispatch`].
    pub fn set_admission(
        &mut self,
        model: &str,
        policy: Option<AdmissionPolicy>,
    ) -> Result<(), AdmissionPolicyError> {
        if let Some(p) = &policy {
            p.validate()?;
        }
        let m = self
            .registry
            .model_id(model)
            .ok_or_else(|| AdmissionPolicyError::UnknownModel(model.to_owned()))?;
        self.admission[m.index()].policy = policy;
        Ok(())
    }

    /// `model`'s admission policy, if it has one.
    pub fn admission_policy(&self, model: &str) -> Option<AdmissionPolicy> {
        let m = self.registry.model_id(model)?;
        self.admission[m.index()].policy
    }

    /// `model`'s admission counters (zero for a model without a policy).
    pub fn admission_stats(&self, model: &str) -> Result<AdmissionStats, RegistryError> {
        let m = self
            .registry
            .model_id(model)
            .ok_or_else(|| RegistryError::UnknownModel(model.to_owned()))?;
        let a = &self.admission[m.index()];
        Ok(AdmissionStats {
            queue_len: a.queue.len() as u64,
            ..a.stats
        })
    }

    /// Routes the request, or holds or sheds it when its model is saturated (see
    /// [`crate::admission`]). Without a policy for the model, exactly [`Router::route`].
    /// Errors are [`Router::route`]'s, whatever the policy.
    pub fn admit(&mut self, req: RouteRequest<'_>, now: Timestamp) -> Result<Admitted, RouteError> {
        let now = self.clock(now);
        let model = self.routed_model(&req)?;
        let Some(policy) = self.admission[model.index()].policy else {
            return self.route(req, now).map(Admitted::Routed);
        };
        self.ready_candidates(model, &req, now)?;
        let (job, saturated) = self.saturation(&req, &policy, now);
        let queue = &self.admission[model.index()].queue;
        let waiting = saturated.is_some() || queue.len() > 0;
        if !waiting {
            self.restrict_to_room(&req, &policy, f64::from(policy.ttft_target_ms));
            self.admission[model.index()].stats.admitted += 1;
            return Ok(Admitted::Routed(
                self.select_and_commit(model, &req, job, now),
            ));
        }
        let retry_after_ms = saturated.unwrap_or(DEFAULT_RETRY_AFTER_MS);
        let a = &mut self.admission[model.index()];
        let shed = if req.priority < 0 {
            Some(ShedReason::Saturated)
        } else if a.queue.len() >= policy.max_queue as usize {
            Some(ShedReason::QueueFull)
        } else {
            None
        };
        if let Some(reason) = shed {
            a.stats.count_shed(reason);
            return Ok(Admitted::Shed(Shed {
                reason,
                retry_after_ms,
            }));
        }
        let id = QueueId(self.next_queue_id);
        self.next_queue_id += 1;
        let deadline = now.add_millis(policy.queue_timeout_ms);
        a.queue
            .push(id, req.priority, req.tenant.unwrap_or(""), now, deadline);
        a.stats.queued += 1;
        Ok(Admitted::Queued(id))
    }

    /// The queued request of `model` to offer next (see [`crate::admission`] for the order).
    pub fn next_queued(&self, model: &str) -> Option<QueueId> {
        let m = self.registry.model_id(model)?;
        self.admission[m.index()].queue.peek()
    }

    /// Offers queued request `id` again (`req` is the request as first admitted): routed if a
    /// pod is predicted to start it within what is left of the target after its wait (it
    /// leaves the queue); shed ([`ShedReason::Late`], it leaves the queue) if pods could start
    /// requests within the target but not this one within what it has left, unless it is
    /// critical (then routed); else it stays queued and nothing changes. Without a policy (it
    /// was removed) it is routed. An error (its model gone, no ready pod) also takes it out of
    /// the queue: answer it. [`RouteError::NotQueued`] if it is not queued.
    pub fn dispatch(
        &mut self,
        id: QueueId,
        req: RouteRequest<'_>,
        now: Timestamp,
    ) -> Result<Admitted, RouteError> {
        let now = self.clock(now);
        let model = match self.routed_model(&req) {
            Ok(m) => m,
            Err(e) => {
                if !self.cancel(id) {
                    return Err(RouteError::NotQueued);
                }
                return Err(e);
            }
        };
        let Some((priority, queued_at)) = self.admission[model.index()].queue.entry(id) else {
            return Err(RouteError::NotQueued);
        };
        if let Err(e) = self.ready_candidates(model, &req, now) {
            self.admission[model.index()].queue.remove(id, false);
            return Err(e);
        }
        let job = match self.admission[model.index()].policy {
            Some(policy) => {
                let (job, saturated) = self.saturation(&req, &policy, now);
                if saturated.is_some() {
                    return Ok(Admitted::Queued(id));
                }
                let left =
                    u64::from(policy.ttft_target_ms).saturating_sub(now.millis_since(queued_at));
                let left = left as f64;
                // Idle pods do not count: the question is whether this request can still
                // make its target, not whether a pod is free.
                let in_time = self
                    .scratch
                    .rooms
                    .iter()
                    .any(|r| admission::in_time(&policy, r, left));
                if in_time {
                    self.restrict_to_room(&req, &policy, left);
                } else if priority > 0 {
                    self.restrict_to_room(&req, &policy, f64::from(policy.ttft_target_ms));
                } else {
                    let a = &mut self.admission[model.index()];
                    a.queue.remove(id, true);
                    a.stats.count_shed(ShedReason::Late);
                    return Ok(Admitted::Shed(Shed {
                        reason: ShedReason::Late,
                        retry_after_ms: DEFAULT_RETRY_AFTER_MS,
                    }));
                }
                job
            }
            None => {
                let total_blocks = u32::try_from(req.hashes.len()).unwrap_or(u32::MAX);
                self.estimates(&req, total_blocks, now, false)
            }
        };
        let a = &mut self.admission[model.index()];
        a.queue.remove(id, true);
        a.stats.dispatched += 1;
        Ok(Admitted::Routed(
            self.select_and_commit(model, &req, job, now),
        ))
    }

    /// Takes a queued request out (its client went away). False if it was not queued.
    pub fn cancel_queued(&mut self, id: QueueId) -> bool {
        self.cancel(id)
    }

    /// Sheds the queued requests whose deadline is at or before `now` ([`ShedReason::Deadline`]),
    /// appending them to `out` for the shell to answer. Due when [`Router::poll_timeout`] says.
    pub fn expire_queued(&mut self, now: Timestamp, out: &mut Vec<(QueueId, Shed)>) {
        let now = self.clock(now);
        let mut ids = Vec::new();
        for a in &mut self.admission {
            ids.clear();
            a.queue.expire(now, &mut ids);
            for &id in &ids {
                a.stats.count_shed(ShedReason::Deadline);
                out.push((
                    id,
                    Shed {
                        reason: ShedReason::Deadline,
                        retry_after_ms: DEFAULT_RETRY_AFTER_MS,
                    },
                ));
            }
        }
    }

    /// The earliest deadline of a queued request, if any (also in [`Router::poll_timeout`]).
    pub fn queue_deadline(&self) -> Option<Timestamp> {
        self.admission
            .iter()
            .filter_map(|a| a.queue.next_deadline())
            .min()
    }

    fn cancel(&mut self, id: QueueId) -> bool {
        for a in &mut self.admission {
            if a.queue.remove(id, false) {
                a.stats.cancelled += 1;
                return true;
            }
        }
        false
    }

    /// Step 2 for every candidate, and whether they are saturated for the request (with the
    /// Retry-After). Leaves the scratch as [`Router::route`]'s step 2 would.
    fn saturation(
        &mut self,
        req: &RouteRequest<'_>,
        policy: &AdmissionPolicy,
        now: Timestamp,
    ) -> (JobSize, Option<u64>) {
        let total_blocks = u32::try_from(req.hashes.len()).unwrap_or(u32::MAX);
        let job = self.estimates(req, total_blocks, now, true);
        let max_age = self.config.ttft.snapshot_max_age_ms;
        let s = &mut self.scratch;
        s.rooms.clear();
        for (c, e) in s.cands.iter().zip(&s.estimates) {
            let snapshot = self.registry.pods[c.pod.index()]
                .model
                .engine
                .filter(|e| now.millis_since(e.at) <= max_age)
                .map(|e| e.snapshot);
            let engine_idle = snapshot.is_none_or(|s| s.running == 0 && s.waiting == 0);
            s.rooms.push(PodRoom {
                ttft_ms: e.ttft_ms,
                queue_ms: e.queue_ms,
                idle: c.load == 0 && engine_idle,
                engine: snapshot.map(|s| (s.waiting, s.kv_usage)),
            });
        }
        let saturated = admission::saturated(policy, &s.rooms);
        let spec = req.strategy.unwrap_or(&self.config.default_strategy);
        if !spec.contains(Strategy::LeastTtft) {
            // As `route` leaves them for a strategy that does not read them.
            s.estimates.clear();
            s.costs.clear();
            s.reuse.clear();
        }
        (job, saturated)
    }

    /// Leaves `least-ttft` (when the spec has it) only the candidates predicted to start the
    /// request within `target_ms` (see [`crate::admission`]), failing those the ones with room, after
    /// [`Router::saturation`]; a no-op when there are neither.
    fn restrict_to_room(
        &mut self,
        req: &RouteRequest<'_>,
        policy: &AdmissionPolicy,
        target_ms: f64,
    ) {
        let spec = req.strategy.unwrap_or(&self.config.default_strategy);
        if !spec.contains(Strategy::LeastTtft) {
            return;
        }
        let s = &mut self.scratch;
        // The pods that start it in time; failing those, the ones with room (idle, or that
        // start it at once).
        let in_time = |r: &PodRoom| admission::in_time(policy, r, target_ms);
        let room = |r: &PodRoom| admission::has_room(policy, r, target_ms);
        let any_in_time = s.rooms.iter().any(in_time);
        if !any_in_time && !s.rooms.iter().any(room) {
            return;
        }
        for (cost, r) in s.costs.iter_mut().zip(&s.rooms) {
            let kept = if any_in_time { in_time(r) } else { room(r) };
            if !kept {
                *cost = f64::INFINITY;
            }
        }
    }
}
