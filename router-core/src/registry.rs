//! Pods, models and in-flight counts.
//!
//! A pod has a name (unique), an `ip:port` address, a readiness flag and the models it serves.
//! Its in-flight count belongs to the pod, not to an object version: updating the address or
//! readiness keeps it (AIBrix v0.7.0 resets it on every pod update in `pkg/cache`; kvroute
//! does not).

use std::sync::Arc;

use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::busy::BusyClock;
use crate::health::{Health, PodHealth};
use crate::ids::{ModelId, PodId};
use crate::ttft::{GlobalModel, PodModel, TtftConfig};

/// Why a registry change was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The pod name is empty.
    #[error("pod name is empty")]
    EmptyPodName,
    /// The model name is empty.
    #[error("model name is empty")]
    EmptyModelName,
    /// The address is not `ip:port` with a numeric IP (what an ORIGINAL_DST cluster accepts).
    #[error("pod address {0:?} is not ip:port")]
    InvalidAddress(String),
    /// The pod id was never issued, or the pod was removed.
    #[error("unknown pod {0}")]
    UnknownPod(PodId),
    /// The model is not known.
    #[error("unknown model {0:?}")]
    UnknownModel(String),
}

/// A pod as the caller describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodSpec<'a> {
    /// Unique name (for example the Kubernetes pod name).
    pub name: &'a str,
    /// `ip:port` the proxy connects to.
    pub address: &'a str,
    /// Whether the pod may receive new requests.
    pub ready: bool,
}

/// A read-only view of one pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodInfo {
    /// The pod's id.
    pub id: PodId,
    /// Its name.
    pub name: Arc<str>,
    /// Its `ip:port`.
    pub address: Arc<str>,
    /// Whether it may receive new requests.
    pub ready: bool,
    /// Requests routed to it and not yet completed or expired.
    pub in_flight: u32,
    /// Requests routed to it since it was added.
    pub routed: u64,
    /// The models it serves.
    pub models: Vec<Arc<str>>,
    /// Its engine's concurrent-sequence capacity as the TTFT model sees it.
    pub max_seqs: u32,
    /// Prompt tokens the TTFT model predicted its engine would serve from cache, summed over
    /// the requests routed to it (compare with the engine's `prefix_cache_hits`).
    pub predicted_hit_tokens: u64,
    /// The prefill rate the TTFT model predicts with for it, tokens/s: its own once it has a
    /// few measured samples, the fleet's pooled rate before (the prior until learned).
    pub prefill_tokens_per_s: f64,
    /// The TTFT model's time per output token for it, ms (the prior until learned).
    pub tpot_ms: f64,
    /// The TTFT model's fixed part of a TTFT for it, ms (the prior until learned).
    pub overhead_ms: f64,
    /// least-ttft's predicted TTFTs against the reported first-token times of the requests
    /// routed to it (cumulative, kept when it is removed and added again under its name).
    pub ttft_calibration: crate::ttft::TtftCalibration,
    /// Its health: ejection, probing, active checks ([`crate::HealthConfig`]).
    pub health: PodHealth,
    /// Its engine rank when it is one engine of a data-parallel server
    /// ([`crate::Router::set_pod_data_parallel_rank`]).
    pub data_parallel_rank: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct Pod {
    pub(crate) name: Arc<str>,
    pub(crate) address: Arc<str>,
    pub(crate) ready: bool,
    // invariant: a removed pod is in no model's list and not in `by_name`; its slot is kept so
    // that ids are never reused.
    pub(crate) removed: bool,
    pub(crate) in_flight: u32,
    pub(crate) routed: u64,
    pub(crate) models: SmallVec<[ModelId; 2]>,
    pub(crate) model: PodModel,
    pub(crate) health: Health,
    /// When it had requests from this router in flight (`least-busy-time`).
    pub(crate) busy: BusyClock,
    /// Its engine rank behind a data-parallel server's address.
    pub(crate) data_parallel_rank: Option<u32>,
}

/// The counters of a removed pod, kept by name so that the pod added again under that name
/// carries them on (exported counters never go back).
#[derive(Clone, Copy, Debug, Default)]
struct Retired {
    routed: u64,
    ejections: [u64; 2],
    calibration: crate::ttft::TtftCalibration,
}

#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) name: Arc<str>,
    // invariant: live pods only, each once, in the order they were attached; none if removed.
    pub(crate) pods: Vec<PodId>,
    /// Removed with [`Registry::remove_model`] and not added again: no longer served.
    pub(crate) removed: bool,
}

/// Pods and models, interned.
#[derive(Debug)]
pub(crate) struct Registry {
    pub(crate) pods: Vec<Pod>,
    pub(crate) models: Vec<Model>,
    pod_by_name: HashMap<Arc<str>, PodId, ahash::RandomState>,
    model_by_name: HashMap<Arc<str>, ModelId, ahash::RandomState>,
    retired: HashMap<Arc<str>, Retired, ahash::RandomState>,
}

fn valid_address(addr: &str) -> bool {
    addr.parse::<core::net::SocketAddr>().is_ok()
}

impl Registry {
    pub(crate) fn new(hasher_seed: u64) -> Self {
        let k = |i: u64| crate::hash::mix64(hasher_seed.wrapping_add(i));
        Registry {
            pods: Vec::new(),
            models: Vec::new(),
            pod_by_name: HashMap::with_hasher(ahash::RandomState::with_seeds(
                k(11),
                k(12),
                k(13),
                k(14),
            )),
            model_by_name: HashMap::with_hasher(ahash::RandomState::with_seeds(
                k(21),
                k(22),
                k(23),
                k(24),
            )),
            retired: HashMap::with_hasher(ahash::RandomState::with_seeds(
                k(31),
                k(32),
                k(33),
                k(34),
            )),
        }
    }

    pub(crate) fn pod(&self, id: PodId) -> Result<&Pod, RegistryError> {
        match self.pods.get(id.index()) {
            Some(p) if !p.removed => Ok(p),
            _ => Err(RegistryError::UnknownPod(id)),
        }
    }

    pub(crate) fn pod_mut(&mut self, id: PodId) -> Result<&mut Pod, RegistryError> {
        match self.pods.get_mut(id.index()) {
            Some(p) if !p.removed => Ok(p),
            _ => Err(RegistryError::UnknownPod(id)),
        }
    }

    pub(crate) fn pod_id(&self, name: &str) -> Option<PodId> {
        self.pod_by_name.get(name).copied()
    }

    /// The id of a model that is served (added and not removed).
    pub(crate) fn model_id(&self, name: &str) -> Option<ModelId> {
        self.model_by_name
            .get(name)
            .copied()
            .filter(|id| !self.models[id.index()].removed)
    }

    /// Creates the pod, or updates its address and readiness (keeping its in-flight count).
    pub(crate) fn upsert_pod(
        &mut self,
        spec: PodSpec<'_>,
        ttft: &TtftConfig,
    ) -> Result<PodId, RegistryError> {
        if spec.name.is_empty() {
            return Err(RegistryError::EmptyPodName);
        }
        if !valid_address(spec.address) {
            return Err(RegistryError::InvalidAddress(spec.address.to_owned()));
        }
        if let Some(id) = self.pod_id(spec.name) {
            let pod = &mut self.pods[id.index()];
            if &*pod.address != spec.address {
                pod.address = Arc::from(spec.address);
            }
            pod.ready = spec.ready;
            return Ok(id);
        }
        let id = PodId(u32::try_from(self.pods.len()).unwrap_or(u32::MAX));
        let name: Arc<str> = Arc::from(spec.name);
        let retired = self.retired.remove(&name).unwrap_or_default();
        self.pods.push(Pod {
            name: name.clone(),
            address: Arc::from(spec.address),
            ready: spec.ready,
            removed: false,
            in_flight: 0,
            routed: retired.routed,
            models: SmallVec::new(),
            model: PodModel {
                calibration: retired.calibration,
                ..PodModel::new(ttft)
            },
            health: Health::revived(retired.ejections),
            busy: BusyClock::default(),
            data_parallel_rank: None,
        });
        self.pod_by_name.insert(name, id);
        Ok(id)
    }

    pub(crate) fn set_address(&mut self, pod: PodId, address: &str) -> Result<(), RegistryError> {
        if !valid_address(address) {
            return Err(RegistryError::InvalidAddress(address.to_owned()));
        }
        let p = self.pod_mut(pod)?;
        if &*p.address != address {
            p.address = Arc::from(address);
        }
        Ok(())
    }

    pub(crate) fn intern_model(&mut self, name: &str) -> Result<ModelId, RegistryError> {
        if name.is_empty() {
            return Err(RegistryError::EmptyModelName);
        }
        if let Some(&id) = self.model_by_name.get(name) {
            self.models[id.index()].removed = false;
            return Ok(id);
        }
        let id = ModelId(self.models.len() as u32);
        let name: Arc<str> = Arc::from(name);
        self.models.push(Model {
            name: name.clone(),
            pods: Vec::new(),
            removed: false,
        });
        self.model_by_name.insert(name, id);
        Ok(id)
    }

    pub(crate) fn attach(&mut self, model: ModelId, pod: PodId) -> Result<(), RegistryError> {
        let p = self.pod_mut(pod)?;
        if !p.models.contains(&model) {
            p.models.push(model);
            self.models[model.index()].pods.push(pod);
        }
        Ok(())
    }

    pub(crate) fn detach(&mut self, model: ModelId, pod: PodId) -> Result<(), RegistryError> {
        let p = self.pod_mut(pod)?;
        p.models.retain(|m| *m != model);
        self.models[model.index()].pods.retain(|x| *x != pod);
        Ok(())
    }

    /// Detaches every pod from the model and marks it removed: a later request for it is for an
    /// unknown model. Its id stays its own (open tickets and statistics keep pointing at it),
    /// and adding the name again revives it.
    pub(crate) fn remove_model(&mut self, name: &str) -> Result<ModelId, RegistryError> {
        let id = self
            .model_id(name)
            .ok_or_else(|| RegistryError::UnknownModel(name.to_owned()))?;
        self.models[id.index()].removed = true;
        for pod in std::mem::take(&mut self.models[id.index()].pods) {
            self.pods[pod.index()].models.retain(|m| *m != id);
        }
        Ok(id)
    }

    /// Marks the pod removed; its slot stays so the id is never reused, and its counters are
    /// kept for a pod added again under its name.
    pub(crate) fn remove_pod(&mut self, pod: PodId) -> Result<(), RegistryError> {
        let p = self.pod_mut(pod)?;
        p.removed = true;
        p.ready = false;
        p.in_flight = 0;
        let models = std::mem::take(&mut p.models);
        let name = p.name.clone();
        let retired = Retired {
            routed: p.routed,
            ejections: p.health.ejections(),
            calibration: p.model.calibration,
        };
        for m in models {
            self.models[m.index()].pods.retain(|x| *x != pod);
        }
        self.pod_by_name.remove(&name);
        self.retired.insert(name, retired);
        Ok(())
    }

    pub(crate) fn info(&self, id: PodId, global: &GlobalModel) -> Option<PodInfo> {
        let p = self.pod(id).ok()?;
        Some(PodInfo {
            id,
            name: p.name.clone(),
            address: p.address.clone(),
            ready: p.ready,
            in_flight: p.in_flight,
            routed: p.routed,
            models: p
                .models
                .iter()
                .map(|m| self.models[m.index()].name.clone())
                .collect(),
            max_seqs: p.model.max_seqs,
            predicted_hit_tokens: p.model.predicted_hit_tokens,
            prefill_tokens_per_s: p.model.prefill_rate(global),
            tpot_ms: p.model.tpot_ms.get(),
            overhead_ms: p.model.overhead_ms.get(),
            ttft_calibration: p.model.calibration,
            health: p.health.view(),
            data_parallel_rank: p.data_parallel_rank,
        })
    }

    pub(crate) fn live_pods(&self) -> impl Iterator<Item = PodId> + '_ {
        self.pods
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.removed)
            .map(|(i, _)| PodId(i as u32))
    }

    /// Σ in-flight over live pods.
    pub(crate) fn total_in_flight(&self) -> u64 {
        self.pods
            .iter()
            .filter(|p| !p.removed)
            .map(|p| u64::from(p.in_flight))
            .sum()
    }
}
