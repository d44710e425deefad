//! The golden cases of `tests/tokenizer/` (computed by Python `tokenizers` and transformers'
//! Jinja environment): every completion and chat case must match exactly, with both engines,
//! uncached and through a prefix store, for every template in `chat_templates.json`.

use std::path::PathBuf;

use kvroute_tokens::{EncodeError, Engine, ModelTokenizer, PrefixStore, PrefixStoreConfig};
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/tokenizer")
}

fn load() -> ModelTokenizer {
    let d = dir();
    ModelTokenizer::from_files(
        &d.join("tokenizer.json"),
        Some(&d.join("tokenizer_config.json")),
    )
    .unwrap()
}

fn golden() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("golden.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

fn engines(model: ModelTokenizer) -> Vec<ModelTokenizer> {
    let d = dir();
    let again = ModelTokenizer::from_files(
        &d.join("tokenizer.json"),
        Some(&d.join("tokenizer_config.json")),
    )
    .unwrap();
    vec![
        model.with_engine(Engine::Fast),
        again.with_engine(Engine::Reference),
    ]
}

#[test]
fn the_fixture_uses_the_fast_engine() {
    let model = load();
    assert_eq!(
        model.engine(),
        Engine::Fast,
        "{:?}",
        model.fast_unsupported()
    );
}

#[test]
fn completions() {
    let g = golden();
    let cases: Vec<&Value> = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "completion")
        .collect();
    assert!(cases.len() >= 40);
    for model in engines(load()) {
        let small = PrefixStore::new(PrefixStoreConfig {
            block_bytes: 32,
            capacity_bytes: 4096,
            ..Default::default()
        })
        .unwrap();
        let store = PrefixStore::default();
        for round in 0..2 {
            for case in &cases {
                let text = case["text"].as_str().unwrap();
                let want = ids(&case["ids"]);
                let note = case["note"].as_str().unwrap();
                assert_eq!(
                    model.encode_completion(text).unwrap(),
                    want,
                    "{:?} {note}",
                    model.engine()
                );
                assert_eq!(
                    model.encode_completion_cached(&store, text).unwrap(),
                    want,
                    "round {round}: {note}"
                );
                assert_eq!(
                    model.encode_cached(&small, text, true).unwrap(),
                    want,
                    "small store, round {round}: {note}"
                );
            }
        }
        let stats = store.stats();
        assert!(stats.hits > 0 && stats.tokens_reused > 0, "{stats:?}");
        assert!(small.stats().bytes_used <= 4096);
    }
}

#[test]
fn chats_for_every_template() {
    let g = golden();
    let templates: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(dir().join("chat_templates.json")).unwrap()).unwrap();
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir().join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        templates["llama3"], config["chat_template"],
        "the config's template is `llama3`"
    );
    for (name, source) in &templates {
        let cases: Vec<&Value> = g["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["kind"] == "chat" && c["template"] == name.as_str())
            .collect();
        assert!(!cases.is_empty(), "no case for template {name}");
        for model in engines(load()) {
            let model = model.with_chat_template(source.as_str().unwrap()).unwrap();
            let store = PrefixStore::default();
            for case in &cases {
                let note = case["note"].as_str().unwrap();
                let agp = case["add_generation_prompt"].as_bool().unwrap();
                let tools = case.get("tools");
                let got = model.render_chat_with_tools(&case["messages"], tools, agp);
                if let Some(error) = case.get("error") {
                    let error = error.as_str().unwrap();
                    let err = got.unwrap_err();
                    assert!(
                        err.to_string().contains(error),
                        "{note}: {err} does not contain {error:?}"
                    );
                    if case.get("rejected_before_template") == Some(&Value::Bool(true)) {
                        assert_eq!(err, EncodeError::EmptyConversation, "{note}");
                    } else {
                        assert!(matches!(err, EncodeError::Template(_)), "{note}: {err:?}");
                    }
                    continue;
                }
                let rendered = got.unwrap_or_else(|e| panic!("{note}: {e}"));
                assert_eq!(
                    rendered,
                    case["rendered"].as_str().unwrap(),
                    "{name}: {note}"
                );
                let want = ids(&case["ids"]);
                assert_eq!(
                    model.encode(&rendered, false).unwrap(),
                    want,
                    "{name}: {note}"
                );
                assert_eq!(
                    model.encode_cached(&store, &rendered, false).unwrap(),
                    want,
                    "{name}: {note}"
                );
                if tools.is_none() {
                    assert_eq!(
                        model.encode_chat(&case["messages"], agp).unwrap(),
                        want,
                        "{name}: {note}"
                    );
                    assert_eq!(
                        model
                            .encode_chat_cached(&store, &case["messages"], agp)
                            .unwrap(),
                        want,
                        "{name}: {note}"
                    );
                }
            }
        }
    }
}

#[test]
fn chat_without_template_is_a_defined_error() {
    let d = dir();
    let model = ModelTokenizer::from_files(&d.join("tokenizer.json"), None).unwrap();
    let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
    assert_eq!(
        model.encode_chat(&messages, true),
        Err(EncodeError::NoChatTemplate)
    );
    assert_eq!(model.encode_completion("").unwrap(), vec![4000]);
}
