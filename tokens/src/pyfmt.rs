//! Python's formatting where chat templates observe it: `json.dumps` (transformers' `tojson`
//! filter), `str()` of values printed by `{{ ... }}` (`True`, `None`, `['a']`, `{'k': 1}`), and
//! `str.strip()`'s notion of whitespace.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// Options of `json.dumps` that transformers' `tojson` exposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonOptions {
    /// `indent`: `None` for one line; `Some(s)` puts each item on its own line, indented by `s`
    /// per level (an integer `n` means `n` spaces).
    pub(crate) indent: Option<String>,
    /// `separators`: item and key separators. Python's defaults are `(", ", ": ")` without an
    /// indent and `(",", ": ")` with one.
    pub(crate) separators: Option<(String, String)>,
    /// `sort_keys`.
    pub(crate) sort_keys: bool,
    /// `ensure_ascii` (transformers' default: false).
    pub(crate) ensure_ascii: bool,
}

/// `json.dumps(value, ...)` as Python writes it. Undefined values are written as `null`.
pub(crate) fn json_dumps(value: &Value, opts: &JsonOptions) -> String {
    let (item_sep, key_sep) = match (&opts.separators, &opts.indent) {
        (Some((i, k)), _) => (i.clone(), k.clone()),
        (None, None) => (", ".to_string(), ": ".to_string()),
        (None, Some(_)) => (",".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    let w = JsonWriter {
        opts,
        item_sep: &item_sep,
        key_sep: &key_sep,
    };
    w.value(&mut out, value, 0);
    out
}

struct JsonWriter<'a> {
    opts: &'a JsonOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl JsonWriter<'_> {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(indent) = &self.opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    }

    fn value(&self, out: &mut String, value: &Value, level: usize) {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => number(out, value, "NaN", "Infinity"),
            ValueKind::String => {
                json_string(out, value.as_str().unwrap_or(""), self.opts.ensure_ascii)
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter().map(|i| i.collect()).unwrap_or_default();
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.value(out, item, level + 1);
                }
                self.newline(out, level);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> =
                    value.try_iter().map(|i| i.collect()).unwrap_or_default();
                if keys.is_empty() {
                    out.push_str("{}");
                    return;
                }
                if self.opts.sort_keys {
                    keys.sort_by_key(|a| a.to_string());
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    let item = value.get_item(key).unwrap_or_default();
                    match key.kind() {
                        // Python converts non-string keys: True -> "true", None -> "null", 1 -> "1".
                        ValueKind::String => {
                            json_string(out, key.as_str().unwrap_or(""), self.opts.ensure_ascii)
                        }
                        _ => {
                            let mut k = String::new();
                            self.value(&mut k, key, 0);
                            json_string(out, k.trim_matches('"'), self.opts.ensure_ascii)
                        }
                    }
                    out.push_str(self.key_sep);
                    self.value(out, &item, level + 1);
                }
                self.newline(out, level);
                out.push('}');
            }
            _ => json_string(out, &value.to_string(), self.opts.ensure_ascii),
        }
    }
}

/// Writes a number as Python does (`str(int)`, `repr(float)`); `nan`/`inf` use the given words.
fn number(out: &mut String, value: &Value, nan: &str, inf: &str) {
    match f64::try_from(value.clone()) {
        Ok(f) if !value.is_integer() => out.push_str(&py_float(f, nan, inf)),
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// `repr(float)` in Python: shortest round-trip digits, positional for exponents in [-4, 16),
/// scientific (`1e+16`, `1.5e-07`) otherwise, always with a `.0` when integral and positional.
pub(crate) fn py_float(f: f64, nan: &str, inf: &str) -> String {
    if f.is_nan() {
        return nan.to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            inf.to_string()
        } else {
            format!("-{inf}")
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let s = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `str(value)` for the values a template prints: `True`/`False`, `None`, floats as
/// `repr`, containers as `repr` (`['a', 1]`, `{'k': None}`); strings and integers as they are.
/// Undefined prints nothing.
pub(crate) fn py_str(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or("")),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => py_repr(out, value),
        _ => py_scalar(out, value),
    }
}

fn py_scalar(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => number(out, value, "nan", "inf"),
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's `repr(value)`.
fn py_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::String => py_repr_str(out, value.as_str().unwrap_or("")),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(iter) = value.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = value.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &key);
                    out.push_str(": ");
                    py_repr(out, &value.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => py_scalar(out, value),
    }
}

/// `repr(str)`: single quotes unless the text has a `'` and no `"`.
fn py_repr_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isspace()` for one character: Unicode White_Space plus the ASCII information
/// separators U+001C..U+001F (which Rust's `char::is_whitespace` leaves out).
pub(crate) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(v: serde_json::Value, indent: Option<&str>) -> String {
        let opts = JsonOptions {
            indent: indent.map(str::to_string),
            separators: None,
            sort_keys: false,
            ensure_ascii: false,
        };
        json_dumps(&Value::from(minijinja::value::Serde(&v)), &opts)
    }

    #[test]
    fn json_dumps_matches_python() {
        let v = serde_json::json!({"b": [1, 2.5, null, true], "a": "<&'é\n>", "c": {}, "d": []});
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            dumps(v.clone(), None),
            r#"{"b": [1, 2.5, null, true], "a": "<&'é\n>", "c": {}, "d": []}"#
        );
        // json.dumps(v, ensure_ascii=False, indent=2)
        assert_eq!(
            dumps(v, Some("  ")),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"<&'é\\n>\",\n  \"c\": {},\n  \"d\": []\n}"
        );
    }

    #[test]
    fn python_float_repr() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (123456.789, "123456.789"),
            (-0.0001, "-0.0001"),
            (0.00001, "1e-05"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(py_float(f, "NaN", "Infinity"), s);
        }
    }

    #[test]
    fn python_str_of_values() {
        let mut out = String::new();
        for v in [
            Value::from(true),
            Value::from(()),
            Value::from(minijinja::value::Serde(
                serde_json::json!(["a", 1, {"k": null}, "it's"]),
            )),
        ] {
            py_str(&mut out, &v);
            out.push('|');
        }
        assert_eq!(out, r#"True|None|['a', 1, {'k': None}, "it's"]|"#);
    }
}
