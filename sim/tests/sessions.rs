//! Closed-loop conversations: a later turn is sent after the previous answer (plus think time),
//! carries the previous prompt and answer, and finds the answer's blocks cached where the
//! previous turn ran.

use kvroute_core::StrategySpec;
use kvroute_sim::cluster::{Cluster, ClusterConfig};
use kvroute_sim::report::RequestRecord;
use kvroute_sim::workload::parse_trace;

/// Two conversations of three turns: a 3,000-token first prompt, 1,000-token answers, 1.5 s
/// of think time, 20-token follow-up questions.
const CHATS: &str = r#"
{"at": 0.0, "session": "c1", "prompt_id": "doc-1", "prompt_tokens": 3000, "output_tokens": 1000}
{"at": 0.1, "session": "c2", "prompt_id": "doc-2", "prompt_tokens": 3000, "output_tokens": 1000}
{"session": "c1", "think_s": 1.5, "suffix": " and then what happened next in the story", "output_tokens": 1000}
{"session": "c2", "think_s": 1.5, "suffix": " and then what happened next in the story", "output_tokens": 1000}
{"session": "c1", "think_s": 1.5, "suffix": " tell me more about it", "output_tokens": 10}
{"session": "c2", "think_s": 1.5, "suffix": " tell me more about it", "output_tokens": 10}
"#;

fn run(strategy: &str) -> Vec<RequestRecord> {
    let arrivals = parse_trace(CHATS).unwrap().arrivals;
    let mut c = Cluster::new(ClusterConfig::default()).unwrap();
    let r = c
        .run(&arrivals, &StrategySpec::parse(strategy).unwrap(), "chat")
        .unwrap();
    assert_eq!(c.router().open_tickets(), 0);
    assert!(r.records.iter().all(|x| x.success), "{:?}", r.records);
    r.records
}

#[test]
fn a_later_turn_is_sent_after_the_previous_answer_and_its_think_time() {
    let records = run("least-request");
    for (turn, previous) in [(2, 0), (3, 1), (4, 2), (5, 3)] {
        let before = &records[previous];
        let answered = before.sent_s.unwrap() + before.e2e_s.unwrap();
        let sent = records[turn].sent_s.unwrap();
        assert!(
            (sent - (answered + 1.5)).abs() < 1e-6,
            "turn {turn}: sent at {sent}, previous answered at {answered}"
        );
        assert_eq!(records[turn].planned_s, sent, "planned when it became due");
        // The prompt grows by the answer and the question.
        let grown = records[turn].prompt_tokens.unwrap() - before.prompt_tokens.unwrap();
        assert!((1_000..1_020).contains(&grown), "turn {turn}: +{grown}");
    }
}

#[test]
fn session_affinity_keeps_a_conversation_where_its_answer_is_cached() {
    let records = run("session-affinity");
    for (turn, previous) in [(2, 0), (3, 1), (4, 2), (5, 3)] {
        assert_eq!(records[turn].pod, records[previous].pod, "turn {turn}");
        // The engine block is 1,568 tokens: the first prompt (3,000) fills one, prompt and
        // answer (3,999 computed) two: the second turn reuses the answer's block too.
        let before = &records[previous];
        let computed = before.prompt_tokens.unwrap() + before.output_tokens.unwrap() - 1;
        let expected = computed / 1568 * 1568;
        assert_eq!(records[turn].cached_tokens, Some(expected), "turn {turn}");
    }
}
