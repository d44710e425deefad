//! A trace's `warm` and `index` lines applied to a cluster before its run: engine caches and
//! the router's index as they stand when the first request arrives.

use super::{Cluster, SimError};
use crate::workload::trace::{Placement, PlacementKind};

impl Cluster {
    /// Applies `placements` in order. [`PlacementKind::Warm`] caches the prompt's blocks on
    /// the pod's engine ([`Cluster::prime_engine`]), [`PlacementKind::Index`] writes them into
    /// the router's index under the pod ([`Cluster::place_in_index`]); pod `*` is every pod
    /// the cluster starts with. No time passes. Fails, at the first such line, on a pod the
    /// cluster does not start with (not one of its pods, or one a pod line adds later) or a
    /// prompt the tokenizer refuses.
    pub fn place(&mut self, placements: &[Placement]) -> Result<(), SimError> {
        for p in placements {
            let pods: Vec<usize> = if p.pod == "*" {
                (0..self.config.pods.len())
                    .filter(|&i| self.pod_state.serving(i))
                    .collect()
            } else {
                let i = self
                    .config
                    .pods
                    .iter()
                    .position(|name| *name == p.pod)
                    .filter(|&i| self.pod_state.serving(i))
                    .ok_or_else(|| SimError::TracePod {
                        line: p.line,
                        pod: p.pod.clone(),
                    })?;
                vec![i]
            };
            for pod in pods {
                match p.kind {
                    PlacementKind::Warm => self.prime_engine(pod, &p.prompt)?,
                    PlacementKind::Index => self.place_in_index(pod, &p.prompt)?,
                }
            }
        }
        Ok(())
    }
}
