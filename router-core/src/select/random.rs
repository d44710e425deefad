//! `random`: uniform over the ready pods (AIBrix v0.7.0's `algorithms/random.go`).

use super::Candidate;

/// The index of a uniformly chosen candidate. `cands` must not be empty.
pub(crate) fn random(cands: &[Candidate], rng: &mut fastrand::Rng) -> usize {
    rng.usize(..cands.len())
}
