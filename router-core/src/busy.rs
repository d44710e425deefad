//! A pod's busy-time ratio: the share of the last minute it had at least one request from this
//! router in flight (`least-busy-time` and `least-utilization`). An engine with a request to
//! run keeps its GPU stepping, so this is the GPU busy-time ratio AIBrix names but never
//! collects, as far as this router's traffic goes.
//!
//! Busy milliseconds are kept per second of the caller's clock, for the last 60 seconds, in
//! integers: the ratio is exact to the millisecond and the same on every platform.

use crate::time::Timestamp;

/// Seconds the ratio looks back over (the current, partial one included).
const WINDOW_SECONDS: u64 = 60;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BusyClock {
    /// When the clock started (its first call), ms.
    since: Option<u64>,
    /// Busy time is accounted up to here, ms.
    last: u64,
    /// Whether the pod has had a request in flight since `last`.
    busy: bool,
    /// Busy ms of second `s` at `slots[s % 60]`, for the 60 seconds up to and including
    /// `last / 1000` (older seconds' slots are reused).
    slots: [u16; WINDOW_SECONDS as usize],
}

impl Default for BusyClock {
    fn default() -> Self {
        BusyClock {
            since: None,
            last: 0,
            busy: false,
            slots: [0; WINDOW_SECONDS as usize],
        }
    }
}

impl BusyClock {
    /// Accounts the time up to `now` (a time before the last one counts as the last one).
    pub(crate) fn advance(&mut self, now: Timestamp) {
        let now = now.as_millis();
        let Some(_) = self.since else {
            self.since = Some(now);
            self.last = now;
            return;
        };
        if now <= self.last {
            return;
        }
        let (old_s, new_s) = (self.last / 1_000, now / 1_000);
        // The seconds after the last one accounted start empty.
        if new_s - old_s >= WINDOW_SECONDS {
            self.slots = [0; WINDOW_SECONDS as usize];
        } else {
            for s in old_s + 1..=new_s {
                self.slots[(s % WINDOW_SECONDS) as usize] = 0;
            }
        }
        if self.busy {
            // Only the window's seconds are kept.
            let mut t = self
                .last
                .max((new_s + 1).saturating_sub(WINDOW_SECONDS) * 1_000);
            while t < now {
                let second_end = (t / 1_000 + 1) * 1_000;
                let end = second_end.min(now);
                let slot = &mut self.slots[((t / 1_000) % WINDOW_SECONDS) as usize];
                // At most 1,000 per second.
                *slot = slot.saturating_add((end - t) as u16);
                t = end;
            }
        }
        self.last = now;
    }

    /// From `now` on, whether the pod has a request in flight.
    pub(crate) fn set_busy(&mut self, now: Timestamp, busy: bool) {
        self.advance(now);
        self.busy = busy;
    }

    /// The busy share of the window up to `now` (the last 59 whole seconds and the current
    /// one), or of the time since the clock started if that is shorter; 0 before any time has
    /// passed.
    pub(crate) fn ratio(&mut self, now: Timestamp) -> f64 {
        self.advance(now);
        let now = self.last;
        let window_start = (now / 1_000 + 1).saturating_sub(WINDOW_SECONDS) * 1_000;
        let start = window_start.max(self.since.unwrap_or(now));
        let span = now - start;
        if span == 0 {
            return 0.0;
        }
        let busy: u64 = self.slots.iter().map(|&ms| u64::from(ms)).sum();
        (busy.min(span) as f64) / span as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn idle_and_fully_busy() {
        let mut c = BusyClock::default();
        assert_eq!(c.ratio(t(1_000)), 0.0, "no time yet");
        assert_eq!(c.ratio(t(5_000)), 0.0);
        c.set_busy(t(5_000), true);
        assert_eq!(
            c.ratio(t(9_000)),
            0.5,
            "busy 4 s of the 8 s since the start"
        );
        assert_eq!(c.ratio(t(200_000)), 1.0, "busy the whole window");
    }

    #[test]
    fn the_window_is_the_last_minute() {
        let mut c = BusyClock::default();
        c.advance(t(0));
        c.set_busy(t(0), true);
        c.set_busy(t(30_000), false);
        // Window at 90.5 s: seconds 31..=90, 59.5 s long, none of it busy.
        assert_eq!(c.ratio(t(90_500)), 0.0);
        let mut c = BusyClock::default();
        c.advance(t(0));
        c.set_busy(t(50_000), true);
        c.set_busy(t(65_250), false);
        // At 100 s: the window is seconds 41..=100 (59 s + 0 ms of the 100th), busy 15.25 s.
        let r = c.ratio(t(100_000));
        assert!((r - 15_250.0 / 59_000.0).abs() < 1e-12, "{r}");
    }

    #[test]
    fn busy_time_straddling_seconds_is_split_exactly() {
        let mut c = BusyClock::default();
        c.advance(t(10_000));
        c.set_busy(t(10_400), true);
        c.set_busy(t(12_100), false);
        // 1,700 ms busy over 10 s.
        assert_eq!(c.ratio(t(20_000)), 0.17);
        // Time going back changes nothing.
        assert_eq!(c.ratio(t(15_000)), 0.17);
    }

    #[test]
    fn a_long_gap_clears_the_window() {
        let mut c = BusyClock::default();
        c.advance(t(0));
        c.set_busy(t(0), true);
        c.set_busy(t(59_000), false);
        assert_eq!(c.ratio(t(10_000_000)), 0.0);
        c.set_busy(t(10_000_000), true);
        // The window: 59 whole seconds and none of the current one; busy the last 30.
        assert_eq!(c.ratio(t(10_030_000)), 30_000.0 / 59_000.0);
    }
}
