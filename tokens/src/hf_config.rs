//! The fields of Hugging Face's `tokenizer_config.json` that chat rendering needs.
//!
//! Read: `chat_template` (a string, or the list form `[{"name", "template"}, ...]`), and the
//! special-token strings `bos_token`, `eos_token`, `unk_token`, `pad_token` (each a string, an
//! AddedToken object `{"content": ...}`, or null). Everything else in the file is ignored.

use serde_json::Value;

use crate::error::LoadError;

/// The name under which a single-string `chat_template` is stored, and the entry of the list form
/// that chat requests use (as transformers does when no template name is asked for).
pub(crate) const DEFAULT_TEMPLATE: &str = "default";

/// What chat rendering reads from `tokenizer_config.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HfConfig {
    /// Named template sources, in file order. A single-string `chat_template` is named
    /// [`DEFAULT_TEMPLATE`].
    pub(crate) templates: Vec<(String, String)>,
    /// Special-token strings passed to the template as variables: `(variable name, content)`,
    /// only for the tokens the file sets (transformers passes only the set ones).
    pub(crate) special_tokens: Vec<(&'static str, String)>,
}

/// Special-token fields passed to chat templates, in transformers' `special_tokens_map` order.
const SPECIAL_FIELDS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

impl HfConfig {
    /// Parses the bytes of a `tokenizer_config.json`.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, LoadError> {
        let root: Value =
            serde_json::from_slice(bytes).map_err(|e| LoadError::Config(e.to_string()))?;
        let Value::Object(map) = &root else {
            return Err(LoadError::Config("top level is not an object".into()));
        };
        let mut config = HfConfig::default();
        match map.get("chat_template") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => config.templates.push((DEFAULT_TEMPLATE.into(), s.clone())),
            Some(Value::Array(list)) => {
                for (i, item) in list.iter().enumerate() {
                    let name = item.get("name").and_then(Value::as_str);
                    let template = item.get("template").and_then(Value::as_str);
                    match (name, template) {
                        (Some(n), Some(t)) => config.templates.push((n.into(), t.into())),
                        _ => {
                            return Err(LoadError::Config(format!(
                            "chat_template[{i}] is not {{\"name\": string, \"template\": string}}"
                        )))
                        }
                    }
                }
            }
            Some(_) => {
                return Err(LoadError::Config(
                    "chat_template is neither a string nor a list of {name, template}".into(),
                ))
            }
        }
        for field in SPECIAL_FIELDS {
            match map.get(field) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => config.special_tokens.push((field, s.clone())),
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => config.special_tokens.push((field, s.clone())),
                    _ => {
                        return Err(LoadError::Config(format!(
                            "{field} is an object without a string \"content\""
                        )))
                    }
                },
                Some(_) => {
                    return Err(LoadError::Config(format!(
                        "{field} is neither a string, an AddedToken object nor null"
                    )))
                }
            }
        }
        Ok(config)
    }

    #[cfg(test)]
    /// The content of special token `field` (`"bos_token"`, ...), if the file sets it.
    pub(crate) fn special_token(&self, field: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, s)| s.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_template_and_plain_tokens() {
        let c = HfConfig::parse(
            br#"{"chat_template": "{{ x }}", "bos_token": "<s>", "eos_token": null}"#,
        )
        .unwrap();
        assert_eq!(c.templates, vec![("default".into(), "{{ x }}".into())]);
        assert_eq!(c.special_token("bos_token"), Some("<s>"));
        assert_eq!(c.special_token("eos_token"), None);
    }

    #[test]
    fn list_template_and_added_token_objects() {
        let c = HfConfig::parse(
            br#"{"chat_template": [{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}],
                 "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
                 "eos_token": {"content": "</s>"}}"#,
        )
        .unwrap();
        assert_eq!(c.templates.len(), 2);
        assert_eq!(c.templates[1], ("tool_use".into(), "b".into()));
        assert_eq!(c.special_token("bos_token"), Some("<s>"));
        assert_eq!(c.special_token("eos_token"), Some("</s>"));
    }

    #[test]
    fn bad_shapes_are_config_errors() {
        for bad in [
            &b"not json"[..],
            b"[]",
            br#"{"chat_template": 3}"#,
            br#"{"chat_template": [{"name": "x"}]}"#,
            br#"{"bos_token": 1}"#,
            br#"{"bos_token": {"id": 1}}"#,
        ] {
            assert!(
                matches!(HfConfig::parse(bad), Err(LoadError::Config(_))),
                "{bad:?}"
            );
        }
    }
}
