//! Strategy names and weighted multi-strategy specs, parsed as AIBrix v0.7.0 parses them
//! (spec §2.1): comma-separated `name[:weight]`, names case-insensitive and trimmed, integer
//! weights in `0..=1_000_000` defaulting to 1, weight 0 drops an entry.

use core::fmt;
use core::str::FromStr;

/// The largest weight accepted in a multi-strategy spec.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// One selection strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Uniform choice over the ready pods.
    Random,
    /// The ready pod with the fewest in-flight requests; ties uniformly at random.
    LeastRequest,
    /// AIBrix's prefix-cache procedure (spec §3.7).
    PrefixCache,
    /// kvroute's predicted-time-to-first-token minimum (see [`crate::TtftConfig`]).
    LeastTtft,
}

impl Strategy {
    /// Every strategy, in a stable order.
    pub const ALL: [Strategy; 4] = [
        Strategy::Random,
        Strategy::LeastRequest,
        Strategy::PrefixCache,
        Strategy::LeastTtft,
    ];

    /// The name used in the `routing-strategy` header.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Random => "random",
            Strategy::LeastRequest => "least-request",
            Strategy::PrefixCache => "prefix-cache",
            Strategy::LeastTtft => "least-ttft",
        }
    }

    /// Parses one name: case-insensitive, surrounding whitespace ignored.
    pub fn from_name(name: &str) -> Result<Strategy, StrategyError> {
        let trimmed = name.trim();
        Strategy::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(trimmed))
            .ok_or_else(|| StrategyError::UnknownName(trimmed.to_owned()))
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed strategy spec: one strategy, or several with weights.
///
/// A spec whose only non-zero entry is one strategy behaves exactly as that strategy alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrategySpec {
    // invariant: non-empty, every weight in 1..=MAX_WEIGHT, no strategy twice.
    entries: Vec<(Strategy, u32)>,
}

/// Why a strategy spec was rejected. The Envoy service turns every variant into a 400.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StrategyError {
    /// The spec is empty or blank.
    #[error("empty routing strategy")]
    Empty,
    /// A name is not a known strategy.
    #[error("unknown routing strategy {0:?}")]
    UnknownName(String),
    /// A weight is not an integer in `0..=1_000_000`.
    #[error("invalid weight {weight:?} for routing strategy {name:?}")]
    InvalidWeight {
        /// The strategy the weight belongs to.
        name: String,
        /// The weight as written.
        weight: String,
    },
    /// Every entry has weight 0.
    #[error("every routing strategy has weight 0")]
    AllWeightsZero,
    /// The same strategy appears twice.
    #[error("routing strategy {0:?} appears twice")]
    Duplicate(String),
}

impl StrategySpec {
    /// A spec of one strategy.
    pub fn single(strategy: Strategy) -> Self {
        StrategySpec {
            entries: vec![(strategy, 1)],
        }
    }

    /// Parses `name[:weight][,name[:weight]...]`.
    pub fn parse(spec: &str) -> Result<Self, StrategyError> {
        if spec.trim().is_empty() {
            return Err(StrategyError::Empty);
        }
        let mut entries: Vec<(Strategy, u32)> = Vec::new();
        let mut named = Vec::new();
        for part in spec.split(',') {
            let (name, weight) = match part.split_once(':') {
                Some((n, w)) => (n, Some(w)),
                None => (part, None),
            };
            if name.trim().is_empty() {
                return Err(StrategyError::Empty);
            }
            let strategy = Strategy::from_name(name)?;
            let weight = match weight {
                None => 1,
                Some(w) => match w.trim().parse::<u32>() {
                    Ok(v) if v <= MAX_WEIGHT => v,
                    _ => {
                        return Err(StrategyError::InvalidWeight {
                            name: name.trim().to_owned(),
                            weight: w.to_owned(),
                        })
                    }
                },
            };
            if named.contains(&strategy) {
                return Err(StrategyError::Duplicate(strategy.name().to_owned()));
            }
            named.push(strategy);
            if weight > 0 {
                entries.push((strategy, weight));
            }
        }
        if entries.is_empty() {
            return Err(StrategyError::AllWeightsZero);
        }
        Ok(StrategySpec { entries })
    }

    /// The strategy, when the spec names exactly one (with non-zero weight).
    pub fn as_single(&self) -> Option<Strategy> {
        match self.entries.as_slice() {
            [(s, _)] => Some(*s),
            _ => None,
        }
    }

    /// The weighted entries (weight ≥ 1), in the order written.
    pub fn entries(&self) -> &[(Strategy, u32)] {
        &self.entries
    }

    /// Whether the spec includes `strategy`.
    pub fn contains(&self, strategy: Strategy) -> bool {
        self.entries.iter().any(|(s, _)| *s == strategy)
    }
}

impl Default for StrategySpec {
    /// `prefix-cache`, the strategy kvroute exists for.
    fn default() -> Self {
        StrategySpec::single(Strategy::PrefixCache)
    }
}

impl From<Strategy> for StrategySpec {
    fn from(s: Strategy) -> Self {
        StrategySpec::single(s)
    }
}

impl FromStr for StrategySpec {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StrategySpec::parse(s)
    }
}

impl fmt::Display for StrategySpec {
    /// The canonical form: lower-case names, `:weight` only where it is not 1.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (s, w)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(s.name())?;
            if *w != 1 {
                write!(f, ":{w}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_case_insensitive_and_trimmed() {
        assert_eq!(
            Strategy::from_name(" Prefix-Cache "),
            Ok(Strategy::PrefixCache)
        );
        assert_eq!(
            Strategy::from_name("LEAST-REQUEST"),
            Ok(Strategy::LeastRequest)
        );
        assert_eq!(
            Strategy::from_name("round-robin"),
            Err(StrategyError::UnknownName("round-robin".into()))
        );
    }

    #[test]
    fn weighted_specs_parse() {
        let s = StrategySpec::parse("prefix-cache:2, least-request").unwrap();
        assert_eq!(
            s.entries(),
            &[(Strategy::PrefixCache, 2), (Strategy::LeastRequest, 1)]
        );
        assert_eq!(s.to_string(), "prefix-cache:2,least-request");
        assert_eq!(s.as_single(), None);
    }

    #[test]
    fn zero_weights_drop_entries() {
        let s = StrategySpec::parse("prefix-cache:0,random:3").unwrap();
        assert_eq!(s.as_single(), Some(Strategy::Random));
        assert_eq!(
            StrategySpec::parse("random:0"),
            Err(StrategyError::AllWeightsZero)
        );
    }

    #[test]
    fn bad_specs_are_typed_errors() {
        assert_eq!(StrategySpec::parse("  "), Err(StrategyError::Empty));
        assert_eq!(StrategySpec::parse("random,"), Err(StrategyError::Empty));
        assert!(matches!(
            StrategySpec::parse("random:x"),
            Err(StrategyError::InvalidWeight { .. })
        ));
        assert!(matches!(
            StrategySpec::parse("random:1000001"),
            Err(StrategyError::InvalidWeight { .. })
        ));
        assert!(matches!(
            StrategySpec::parse("random:-1"),
            Err(StrategyError::InvalidWeight { .. })
        ));
        assert_eq!(
            StrategySpec::parse("random,RANDOM"),
            Err(StrategyError::Duplicate("random".into()))
        );
        assert!(matches!(
            StrategySpec::parse("foo"),
            Err(StrategyError::UnknownName(_))
        ));
    }
}
