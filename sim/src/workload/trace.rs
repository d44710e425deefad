//! A user workload as JSONL: one request per line, after any lines that warm caches or the
//! router's index before the first request, and among lines that add, remove or fail pods.
//!
//! ```json
//! {"warm": {"pod": "A", "prompt_id": "doc-7", "prompt_tokens": 5000}}
//! {"index": {"pod": "*", "prompt": "literal prompt text"}}
//! {"at": 0.0, "prompt": "literal prompt text", "output_tokens": 128}
//! {"at": 0.625, "prompt_id": "doc-7", "prompt_tokens": 5000, "suffix": " Q1", "output_tokens": 64,
//!  "headers": {"routing-strategy": "least-request"}}
//! {"at": 30, "pod_fail": "A"}
//! ```
//! - A prompt is either `prompt` or `prompt_id` + `prompt_tokens` (a deterministic synthetic
//!   text of that many tokens, equal for equal ids), followed by the optional `suffix`.
//! - A request: `at` is seconds from the start, non-decreasing; `headers` is optional
//!   (`routing-strategy` picks the strategy of that request). `max_tokens` is what it asks
//!   for (the router is told it; the engine accepts the request on it), `output_tokens` how
//!   many tokens the answer has (it stops at EOS when fewer): `output_tokens` alone is both
//!   (as with `ignore_eos`), `max_tokens` alone too, neither is 128 for both, and both must
//!   have `output_tokens` ≤ `max_tokens`.
//! - `warm` and `index` lines ([`Placement`]) name a pod (`*`: every pod) and a prompt; they
//!   come before the first request and are applied, in order, before it is sent: `warm`
//!   caches the prompt's blocks on the pod's engine, `index` writes them into the router's
//!   index under the pod.
//! - A request with a `session` starts a conversation; a later line with the same `session`
//!   is its next turn (closed loop): it has no `at` and no prompt, it is sent `think_s`
//!   (default 0) after the previous turn's answer ends (or fails), and its prompt is the
//!   previous turn's prompt, then the previous answer (a deterministic synthetic text of the
//!   previous turn's `output_tokens` tokens), then its own `suffix`.
//! - `pod_add`, `pod_remove` and `pod_fail` lines ([`PodEvent`]) name a pod and happen at
//!   their `at`, which does not decrease from the lines before them, requests' included.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Deserialize;

use super::{synthetic_prompt, Arrival, FollowUp, STUDY_OUTPUT_TOKENS};

/// A trace line that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The line is not valid JSON of the trace shape.
    #[error("trace line {line}: {source}")]
    Json {
        /// 1-based line number.
        line: usize,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The line is JSON but not a usable request.
    #[error("trace line {line}: {message}")]
    Invalid {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The trace has no request.
    #[error("trace has no request")]
    Empty,
}

/// A parsed trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// The requests, in `at` order.
    pub arrivals: Vec<Arrival>,
    /// The `warm` and `index` lines, in file order.
    pub placements: Vec<Placement>,
    /// The pod lines, in `at` (and file) order.
    pub pod_events: Vec<PodEvent>,
}

/// What happens to a pod at a [`PodEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodEventKind {
    /// `pod_add`: the router is told of the pod (again) and its engine runs: started empty if
    /// it never ran or failed, as it was if it was only removed.
    Add,
    /// `pod_remove`: the pod leaves the router's discovery (no new requests; the router forgets
    /// its index entries); its engine finishes what it has.
    Remove,
    /// `pod_fail`: its engine dies: the requests it holds fail, its cache is lost, requests
    /// sent to it fail to connect. The router is not told: it lists the pod until a
    /// `pod_remove` (or its health tracking ejects it).
    Fail,
}

impl PodEventKind {
    /// The trace key: `pod_add`, `pod_remove` or `pod_fail`.
    pub fn key(self) -> &'static str {
        match self {
            PodEventKind::Add => "pod_add",
            PodEventKind::Remove => "pod_remove",
            PodEventKind::Fail => "pod_fail",
        }
    }
}

/// A pod line: a pod added, removed or failing at a given time.
#[derive(Clone, Debug, PartialEq)]
pub struct PodEvent {
    /// When, µs from the start.
    pub at_us: u64,
    /// The pod's name.
    pub pod: String,
    /// What happens.
    pub kind: PodEventKind,
    /// Its 1-based line in the trace (for errors naming it).
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PodLine {
    at: f64,
    pod_add: Option<String>,
    pod_remove: Option<String>,
    pod_fail: Option<String>,
}

/// What a [`Placement`] puts where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementKind {
    /// The prompt's blocks are cached on the pod's engine (as if it had served the prompt).
    Warm,
    /// The prompt's blocks are in the router's index under the pod (as if the router had
    /// routed it there).
    Index,
}

/// A `warm` or `index` line: state before the first request.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// What it places.
    pub kind: PlacementKind,
    /// The pod's name; `*` = every pod.
    pub pod: String,
    /// The prompt text.
    pub prompt: String,
    /// Its 1-based line in the trace (for errors naming it).
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlacementLine {
    pod: String,
    prompt: Option<String>,
    prompt_id: Option<String>,
    prompt_tokens: Option<u32>,
    suffix: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    at: Option<f64>,
    session: Option<String>,
    think_s: Option<f64>,
    prompt: Option<String>,
    prompt_id: Option<String>,
    prompt_tokens: Option<u32>,
    suffix: Option<String>,
    output_tokens: Option<u32>,
    max_tokens: Option<u32>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// A prompt's text from its fields (see the module docs).
fn prompt_text(
    prompt: Option<String>,
    prompt_id: Option<String>,
    prompt_tokens: Option<u32>,
    suffix: Option<String>,
) -> Result<String, &'static str> {
    let prompt = match (prompt, prompt_id, prompt_tokens) {
        (Some(p), None, None) => p,
        (None, Some(id), Some(len)) if (1..=1_000_000).contains(&len) => {
            synthetic_prompt(&id, len as usize)
        }
        (None, Some(_), _) => {
            return Err("`prompt_id` needs `prompt_tokens` between 1 and 1000000")
        }
        _ => return Err("give either `prompt` or `prompt_id` + `prompt_tokens`"),
    };
    let prompt = prompt + suffix.as_deref().unwrap_or("");
    if prompt.is_empty() {
        return Err("the prompt is empty");
    }
    Ok(prompt)
}

/// A `warm` or `index` line, if `value` is one.
fn placement(value: &mut serde_json::Value, line: usize) -> Result<Option<Placement>, TraceError> {
    let kinds = [
        ("warm", PlacementKind::Warm),
        ("index", PlacementKind::Index),
    ];
    let Some(object) = value.as_object_mut() else {
        return Ok(None);
    };
    let Some(&(key, kind)) = kinds.iter().find(|(k, _)| object.contains_key(*k)) else {
        return Ok(None);
    };
    if object.len() != 1 {
        return Err(TraceError::Invalid {
            line,
            message: format!("a `{key}` line has no other key"),
        });
    }
    let fields = object.remove(key).unwrap_or_default();
    let p: PlacementLine =
        serde_json::from_value(fields).map_err(|source| TraceError::Json { line, source })?;
    let prompt = prompt_text(p.prompt, p.prompt_id, p.prompt_tokens, p.suffix).map_err(|m| {
        TraceError::Invalid {
            line,
            message: m.to_owned(),
        }
    })?;
    if p.pod.is_empty() {
        return Err(TraceError::Invalid {
            line,
            message: "`pod` must name a pod (or be `*`)".into(),
        });
    }
    Ok(Some(Placement {
        kind,
        pod: p.pod,
        prompt,
        line,
    }))
}

/// `at` seconds as µs, checked against the previous timed line's (`last`, updated).
fn at_us(at: f64, last: &mut u64) -> Result<u64, &'static str> {
    if !at.is_finite() || !(0.0..=1e7).contains(&at) {
        return Err("`at` must be seconds between 0 and 10^7");
    }
    let us = (at * 1e6).round() as u64;
    if us < *last {
        return Err("`at` must not decrease");
    }
    *last = us;
    Ok(us)
}

/// A pod line, if `value` is one.
fn pod_event(value: &serde_json::Value, line: usize) -> Result<Option<PodLine>, TraceError> {
    let keys = ["pod_add", "pod_remove", "pod_fail"];
    if !value
        .as_object()
        .is_some_and(|o| keys.iter().any(|k| o.contains_key(*k)))
    {
        return Ok(None);
    }
    let p: PodLine = serde_json::from_value(value.clone())
        .map_err(|source| TraceError::Json { line, source })?;
    Ok(Some(p))
}

/// Parses a JSONL trace (blank lines and lines starting with `#` are skipped).
pub fn parse_trace(text: &str) -> Result<Trace, TraceError> {
    let mut out = Vec::new();
    let mut placements = Vec::new();
    let mut pod_events = Vec::new();
    // The index of each conversation's latest turn.
    let mut sessions: HashMap<String, usize> = HashMap::new();
    let mut last = 0u64;
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let raw = raw.trim();
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        let bad = |message: &str| TraceError::Invalid {
            line,
            message: message.to_owned(),
        };
        let mut value: serde_json::Value =
            serde_json::from_str(raw).map_err(|source| TraceError::Json { line, source })?;
        if let Some(p) = placement(&mut value, line)? {
            if !out.is_empty() {
                return Err(bad(
                    "`warm` and `index` lines come before the first request",
                ));
            }
            placements.push(p);
            continue;
        }
        if let Some(p) = pod_event(&value, line)? {
            let named = [
                (PodEventKind::Add, p.pod_add),
                (PodEventKind::Remove, p.pod_remove),
                (PodEventKind::Fail, p.pod_fail),
            ];
            let mut named = named.into_iter().filter_map(|(k, pod)| Some((k, pod?)));
            let (Some((kind, pod)), None) = (named.next(), named.next()) else {
                return Err(bad(
                    "a pod line has one of `pod_add`, `pod_remove`, `pod_fail`",
                ));
            };
            if pod.is_empty() {
                return Err(bad("a pod line names a pod"));
            }
            pod_events.push(PodEvent {
                at_us: at_us(p.at, &mut last).map_err(bad)?,
                pod,
                kind,
                line,
            });
            continue;
        }
        let t: TraceLine =
            serde_json::from_value(value).map_err(|source| TraceError::Json { line, source })?;
        let previous = t.session.as_ref().and_then(|s| sessions.get(s).copied());
        let (at_us, prompt, follows) = match previous {
            None => {
                if t.think_s.is_some() {
                    return Err(bad("`think_s` is for a conversation's later turns"));
                }
                let Some(at) = t.at else {
                    return Err(bad("a request needs `at` (or a `session` seen before)"));
                };
                let at_us = at_us(at, &mut last).map_err(bad)?;
                let prompt =
                    prompt_text(t.prompt, t.prompt_id, t.prompt_tokens, t.suffix).map_err(bad)?;
                (at_us, prompt, None)
            }
            Some(previous) => {
                if t.at.is_some()
                    || t.prompt.is_some()
                    || t.prompt_id.is_some()
                    || t.prompt_tokens.is_some()
                {
                    return Err(bad(
                        "a later turn has no `at` or prompt: it is sent after the previous \
                         turn's answer, whose prompt and answer it extends by its `suffix`",
                    ));
                }
                let think_s = t.think_s.unwrap_or(0.0);
                if !(think_s.is_finite() && (0.0..=86_400.0).contains(&think_s)) {
                    return Err(bad("`think_s` must be between 0 and 86400"));
                }
                let before: &mut Arrival = &mut out[previous];
                let answer: Arc<str> = synthetic_prompt(
                    &format!("answer/{}/{previous}", t.session.as_deref().unwrap_or("")),
                    before.output_tokens as usize,
                )
                .into();
                before.answer = Some(answer.clone());
                let prompt = format!(
                    "{}{answer}{}",
                    before.prompt,
                    t.suffix.as_deref().unwrap_or("")
                );
                let follows = FollowUp {
                    previous,
                    think_us: (think_s * 1e6).round() as u64,
                };
                (0, prompt, Some(follows))
            }
        };
        let output_tokens = t
            .output_tokens
            .or(t.max_tokens)
            .unwrap_or(STUDY_OUTPUT_TOKENS);
        let max_tokens = t.max_tokens.unwrap_or(output_tokens);
        if output_tokens == 0 || max_tokens == 0 {
            return Err(bad("`output_tokens` and `max_tokens` must be at least 1"));
        }
        if output_tokens > max_tokens {
            return Err(bad("`output_tokens` must not exceed `max_tokens`"));
        }
        if let Some(session) = t.session {
            sessions.insert(session, out.len());
        }
        out.push(Arrival {
            at_us,
            family: None,
            prompt: prompt.into(),
            output_tokens,
            max_tokens,
            headers: t.headers,
            follows,
            answer: None,
        });
    }
    if out.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(Trace {
        arrivals: out,
        placements,
        pod_events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::count_tokens;

    #[test]
    fn traces_parse_and_bad_lines_are_errors() {
        let t = "# comment\n{\"at\":0,\"prompt\":\"hi\"}\n{\"at\":1.5,\"prompt_id\":\"x\",\"prompt_tokens\":50,\"output_tokens\":3,\"headers\":{\"routing-strategy\":\"random\"}}\n";
        let a = parse_trace(t).unwrap().arrivals;
        assert_eq!(a.len(), 2);
        assert_eq!(a[1].at_us, 1_500_000);
        assert_eq!(count_tokens(&a[1].prompt), 50);
        assert_eq!(a[1].headers["routing-strategy"], "random");
        assert!(matches!(
            parse_trace("{\"at\":1}"),
            Err(TraceError::Invalid { line: 1, .. })
        ));
        assert!(matches!(
            parse_trace("{\"at\":2,\"prompt\":\"a\"}\n{\"at\":1,\"prompt\":\"b\"}"),
            Err(TraceError::Invalid { line: 2, .. })
        ));
        assert!(matches!(
            parse_trace("nope"),
            Err(TraceError::Json { line: 1, .. })
        ));
        assert!(matches!(parse_trace(""), Err(TraceError::Empty)));
    }

    #[test]
    fn warm_and_index_lines_come_first_and_name_a_pod_and_a_prompt() {
        let t = "{\"warm\":{\"pod\":\"A\",\"prompt_id\":\"sys\",\"prompt_tokens\":40}}\n\
                 {\"index\":{\"pod\":\"*\",\"prompt\":\"hello\",\"suffix\":\" there\"}}\n\
                 {\"at\":0,\"prompt\":\"hi\"}\n";
        let trace = parse_trace(t).unwrap();
        assert_eq!(trace.arrivals.len(), 1);
        assert_eq!(
            trace.placements[0],
            Placement {
                kind: PlacementKind::Warm,
                pod: "A".into(),
                prompt: synthetic_prompt("sys", 40),
                line: 1,
            }
        );
        assert_eq!(trace.placements[1].kind, PlacementKind::Index);
        assert_eq!(
            (
                trace.placements[1].pod.as_str(),
                trace.placements[1].prompt.as_str()
            ),
            ("*", "hello there")
        );
        let invalid = |t: &str| match parse_trace(t) {
            Err(TraceError::Invalid { line, message }) => (line, message),
            other => panic!("{t}: {other:?}"),
        };
        let (line, message) =
            invalid("{\"at\":0,\"prompt\":\"hi\"}\n{\"warm\":{\"pod\":\"A\",\"prompt\":\"x\"}}");
        assert_eq!(line, 2);
        assert!(message.contains("before the first request"), "{message}");
        assert!(
            invalid("{\"warm\":{\"pod\":\"A\",\"prompt\":\"x\"},\"at\":0}")
                .1
                .contains("no other key")
        );
        assert!(invalid("{\"index\":{\"pod\":\"\",\"prompt\":\"x\"}}")
            .1
            .contains("`pod`"));
        assert!(invalid("{\"index\":{\"pod\":\"A\"}}")
            .1
            .contains("give either"));
        assert!(matches!(
            parse_trace("{\"warm\":{\"pod\":\"A\",\"prompt\":\"x\",\"at\":3}}"),
            Err(TraceError::Json { line: 1, .. })
        ));
        assert!(matches!(
            parse_trace("{\"warm\":{\"pod\":\"A\",\"prompt\":\"x\"}}"),
            Err(TraceError::Empty)
        ));
    }

    #[test]
    fn max_tokens_and_output_tokens_default_to_each_other() {
        let lengths = |fields: &str| {
            let a = &parse_trace(&format!("{{\"at\":0,\"prompt\":\"x\"{fields}}}"))
                .unwrap()
                .arrivals[0];
            (a.max_tokens, a.output_tokens)
        };
        assert_eq!(lengths(""), (128, 128));
        assert_eq!(lengths(",\"output_tokens\":7"), (7, 7));
        assert_eq!(lengths(",\"max_tokens\":9"), (9, 9));
        assert_eq!(lengths(",\"max_tokens\":900,\"output_tokens\":7"), (900, 7));
        for bad in [
            ",\"max_tokens\":5,\"output_tokens\":7",
            ",\"max_tokens\":0",
            ",\"output_tokens\":0,\"max_tokens\":5",
        ] {
            let t = format!("{{\"at\":0,\"prompt\":\"x\"{bad}}}");
            assert!(
                matches!(parse_trace(&t), Err(TraceError::Invalid { line: 1, .. })),
                "{t}"
            );
        }
    }

    #[test]
    fn a_later_turn_extends_the_previous_prompt_and_answer_and_follows_it() {
        let t = "{\"at\":0,\"session\":\"c\",\"prompt\":\"hi\",\"output_tokens\":5}\n\
                 {\"at\":0.5,\"prompt\":\"other\"}\n\
                 {\"session\":\"c\",\"think_s\":2,\"suffix\":\" more\",\"output_tokens\":3}\n\
                 {\"session\":\"c\",\"suffix\":\" again\"}\n";
        let a = parse_trace(t).unwrap().arrivals;
        let answer = a[0].answer.clone().expect("a later turn sends it back");
        assert_eq!(count_tokens(&answer), 5);
        assert_eq!(&*a[2].prompt, format!("hi{answer} more"));
        assert_eq!(
            a[2].follows,
            Some(FollowUp {
                previous: 0,
                think_us: 2_000_000
            })
        );
        let second = a[2].answer.clone().unwrap();
        assert_eq!(count_tokens(&second), 3);
        assert_eq!(&*a[3].prompt, format!("{}{second} again", a[2].prompt));
        assert_eq!(a[3].follows.map(|f| (f.previous, f.think_us)), Some((2, 0)));
        assert_eq!(
            (a[1].follows, &a[1].answer, &a[3].answer),
            (None, &None, &None)
        );

        let invalid = |t: &str| match parse_trace(t) {
            Err(TraceError::Invalid { line, message }) => (line, message),
            other => panic!("{t}: {other:?}"),
        };
        let first = "{\"at\":0,\"session\":\"c\",\"prompt\":\"hi\"}\n";
        for (later, says) in [
            ("{\"session\":\"c\",\"at\":1}", "no `at` or prompt"),
            ("{\"session\":\"c\",\"prompt\":\"x\"}", "no `at` or prompt"),
            ("{\"session\":\"c\",\"think_s\":-1}", "`think_s`"),
            ("{\"session\":\"d\",\"suffix\":\"x\"}", "needs `at`"),
            ("{\"at\":1,\"prompt\":\"x\",\"think_s\":1}", "later turns"),
        ] {
            let (line, message) = invalid(&format!("{first}{later}"));
            assert_eq!(line, 2, "{later}");
            assert!(message.contains(says), "{later}: {message}");
        }
    }

    #[test]
    fn pod_lines_happen_at_their_time_among_the_requests() {
        let t = "{\"at\":0,\"prompt\":\"a\"}\n{\"at\":1.5,\"pod_fail\":\"B\"}\n\
                 {\"at\":1.5,\"pod_add\":\"C\"}\n{\"at\":2,\"prompt\":\"b\"}\n{\"at\":9,\"pod_remove\":\"B\"}\n";
        let trace = parse_trace(t).unwrap();
        assert_eq!(trace.arrivals.len(), 2);
        let events: Vec<(u64, &str, PodEventKind, usize)> = trace
            .pod_events
            .iter()
            .map(|e| (e.at_us, e.pod.as_str(), e.kind, e.line))
            .collect();
        assert_eq!(
            events,
            [
                (1_500_000, "B", PodEventKind::Fail, 2),
                (1_500_000, "C", PodEventKind::Add, 3),
                (9_000_000, "B", PodEventKind::Remove, 5),
            ]
        );
        let invalid = |t: &str| match parse_trace(t) {
            Err(TraceError::Invalid { line, message }) => (line, message),
            other => panic!("{t}: {other:?}"),
        };
        let (line, m) = invalid("{\"at\":2,\"prompt\":\"a\"}\n{\"at\":1,\"pod_fail\":\"B\"}");
        assert_eq!((line, m.as_str()), (2, "`at` must not decrease"));
        let (_, m) = invalid("{\"at\":1,\"pod_fail\":\"B\",\"pod_add\":\"C\"}");
        assert!(m.contains("one of"), "{m}");
        assert!(invalid("{\"at\":1,\"pod_fail\":\"\"}")
            .1
            .contains("names a pod"));
        for bad in [
            "{\"pod_fail\":\"B\"}",
            "{\"at\":1,\"pod_fail\":\"B\",\"prompt\":\"x\"}",
            "{\"at\":1,\"pod_fail\":3}",
        ] {
            assert!(
                matches!(parse_trace(bad), Err(TraceError::Json { line: 1, .. })),
                "{bad}"
            );
        }
    }
}
