//! Chat templates, compiled once at load in an environment that behaves like the one
//! transformers' `apply_chat_template` renders in (and so vLLM's chat path).
//!
//! transformers (`utils/chat_template_utils.py`, `_compile_jinja_template`) builds an
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//! extensions=[AssistantTracker, loopcontrols])`, replaces `tojson` by `json.dumps(x,
//! ensure_ascii=False, indent=None, separators=None, sort_keys=False)` and adds the globals
//! `raise_exception(message)` and `strftime_now(format)`. This module mirrors each of those with
//! minijinja:
//! - `trim_blocks`, `lstrip_blocks`, no trailing newline kept (Jinja's default), no auto-escaping;
//! - `break`/`continue` (minijinja's `loop_controls`);
//! - Python string methods (`strip`, `startswith`, `split`, ...) and dict methods through
//!   minijinja-contrib's `pycompat`; `strip`/`lstrip`/`rstrip` without arguments and the `trim`
//!   filter use Python's whitespace (which includes U+001C..U+001F);
//! - `tojson` as [`crate::pyfmt::json_dumps`] (key order kept, no HTML escaping);
//! - `{{ value }}` prints as Python's `str()` (`True`, `None`, `['a']`);
//! - `raise_exception(msg)` fails the render with [`EncodeError::Template`]`(msg)`;
//! - `strftime_now(fmt)` formats the current UTC time (transformers uses local time; a process
//!   in UTC, as containers usually are, gets the same text);
//! - the `{% generation %}` block tag (AssistantTracker, which only records offsets) renders its
//!   body unchanged.
//!
//! Known gaps: `~` and `|string` convert with minijinja's rules (`true`, `none`), not Python's;
//! only the `{{ }}` output path is Python-formatted.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

use crate::error::{EncodeError, LoadError};
use crate::pyfmt::{self, is_py_space, JsonOptions};

/// The compiled chat templates of one model.
pub(crate) struct ChatTemplates {
    env: Environment<'static>,
    names: Vec<String>,
}

impl std::fmt::Debug for ChatTemplates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplates")
            .field("names", &self.names)
            .finish()
    }
}

/// What one render receives besides the template.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenderInput<'a> {
    /// The conversation, passed to the template as `messages` exactly as given.
    pub(crate) messages: &'a serde_json::Value,
    /// The `tools` variable (`None` renders as Python's `None`, which templates test with
    /// `tools is not none` or `if tools`).
    pub(crate) tools: Option<&'a serde_json::Value>,
    /// The `add_generation_prompt` variable.
    pub(crate) add_generation_prompt: bool,
    /// Special-token variables (`bos_token`, ...): only the ones the model sets.
    pub(crate) special_tokens: &'a [(&'static str, String)],
}

/// The error `raise_exception` attaches as the source of its minijinja error, so that the
/// message can be told apart from other render failures.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplates {
    /// Compiles every `(name, source)`; the first failure is a [`LoadError::Template`].
    pub(crate) fn compile(templates: &[(String, String)]) -> Result<Self, LoadError> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .expect("default delimiters are valid"),
        );
        env.set_debug(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(py_methods);
        env.set_formatter(|out, _state, value| {
            let mut s = String::new();
            pyfmt::py_str(&mut s, value);
            out.write_str(&s).map_err(Error::from)
        });
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("trim", py_trim);
        let mut names = Vec::with_capacity(templates.len());
        for (name, source) in templates {
            env.add_template_owned(name.clone(), rewrite_generation_tags(source))
                .map_err(|e| LoadError::Template {
                    name: name.clone(),
                    message: format!("{e:#}"),
                })?;
            names.push(name.clone());
        }
        Ok(ChatTemplates { env, names })
    }

    /// The template names, in file order.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// Renders template `name`. Fails with [`EncodeError::NoChatTemplate`] if there is no such
    /// template, [`EncodeError::Template`] on `raise_exception`, [`EncodeError::Render`] on any
    /// other render failure.
    pub(crate) fn render(&self, name: &str, input: RenderInput<'_>) -> Result<String, EncodeError> {
        let template = self
            .env
            .get_template(name)
            .map_err(|_| EncodeError::NoChatTemplate)?;
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("messages", Value::from(Serde(input.messages)));
        ctx.insert(
            "add_generation_prompt",
            Value::from(input.add_generation_prompt),
        );
        ctx.insert(
            "tools",
            input
                .tools
                .map_or(Value::from(()), |t| Value::from(Serde(t))),
        );
        ctx.insert("documents", Value::from(()));
        for (field, content) in input.special_tokens {
            ctx.insert(field, Value::from(content.as_str()));
        }
        template.render(Value::from(ctx)).map_err(render_error)
    }
}

fn render_error(err: Error) -> EncodeError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return EncodeError::Template(raised.0.clone());
        }
        source = e.source();
    }
    EncodeError::Render(format!("{err:#}"))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)` as
/// transformers defines it.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.kind() {
            ValueKind::Number => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
            _ => Some(v.to_string()),
        },
    };
    let separators = match kwargs.get::<Option<Vec<String>>>("separators")? {
        None => None,
        Some(v) if v.len() == 2 => Some((v[0].clone(), v[1].clone())),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ))
        }
    };
    let opts = JsonOptions {
        indent,
        separators,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(pyfmt::json_dumps(&value, &opts)))
}

/// Jinja's `trim(value, chars=None)`: Python's `str.strip(chars)`.
fn py_trim(value: Value, chars: Option<String>) -> String {
    let s = match value.as_str() {
        Some(s) => s.to_string(),
        None => {
            let mut s = String::new();
            pyfmt::py_str(&mut s, &value);
            s
        }
    };
    match chars {
        None => s.trim_matches(is_py_space).to_string(),
        Some(set) => s.trim_matches(|c| set.contains(c)).to_string(),
    }
}

/// `str.strip()`/`lstrip()`/`rstrip()` without arguments with Python's whitespace; everything
/// else goes to minijinja-contrib's pycompat.
fn py_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), true) = (value.as_str(), args.is_empty()) {
        match method {
            "strip" => return Ok(Value::from(s.trim_matches(is_py_space))),
            "lstrip" => return Ok(Value::from(s.trim_start_matches(is_py_space))),
            "rstrip" => return Ok(Value::from(s.trim_end_matches(is_py_space))),
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` (with any `-`/`+` whitespace markers) to
/// `{% if true %}` / `{% endif %}`, keeping the markers, so the body renders exactly as Jinja
/// renders it.
fn rewrite_generation_tags(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_string();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..close];
        let (lead, body) = split_marker_start(inner);
        let (body, trail) = split_marker_end(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                let _ = write!(out, "{{%{lead} {r} {trail}%}}");
            }
            None => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

fn split_marker_start(s: &str) -> (&str, &str) {
    match s.as_bytes().first() {
        Some(b'-' | b'+') => (&s[..1], &s[1..]),
        _ => ("", s),
    }
}

fn split_marker_end(s: &str) -> (&str, &str) {
    match s.as_bytes().last() {
        Some(b'-' | b'+') => (&s[..s.len() - 1], &s[s.len() - 1..]),
        _ => (s, ""),
    }
}

/// `strftime_now(format)`: the current UTC time formatted with the common `strftime`
/// directives (`%Y %m %d %e %H %I %M %S %p %y %b %B %a %A %j %%`); others are copied as written.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats Unix time `secs` (UTC).
fn strftime(format: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (tod / 3600, tod % 3600 / 60, tod % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('e') => write!(out, "{d:2}"),
            Some('H') => write!(out, "{hh:02}"),
            Some('I') => write!(out, "{:02}", (hh + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{mm:02}"),
            Some('S') => write!(out, "{ss:02}"),
            Some('b') => write!(out, "{}", &MONTHS[m as usize - 1][..3]),
            Some('B') => write!(out, "{}", MONTHS[m as usize - 1]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('j') => write!(out, "{yday:03}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, messages: serde_json::Value) -> Result<String, EncodeError> {
        let t = ChatTemplates::compile(&[("default".into(), src.into())]).unwrap();
        let specials = [("bos_token", "<s>".to_string())];
        t.render(
            "default",
            RenderInput {
                messages: &messages,
                tools: None,
                add_generation_prompt: true,
                special_tokens: &specials,
            },
        )
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        let src =
            "{{ bos_token }}\n  {% for m in messages %}\n    [{{ m.content }}]\n  {% endfor %}\n";
        // jinja2 with trim_blocks + lstrip_blocks: the tag lines vanish, the trailing newline too.
        assert_eq!(
            render(src, serde_json::json!([{"content": "a"}, {"content": "b"}])).unwrap(),
            "<s>\n    [a]\n    [b]\n"
        );
    }

    #[test]
    fn raise_exception_is_a_template_error() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('bad role ' + messages[0].role) }}{% endif %}ok";
        assert_eq!(
            render(src, serde_json::json!([{"role": "tool"}])),
            Err(EncodeError::Template("bad role tool".into()))
        );
        assert_eq!(
            render(src, serde_json::json!([{"role": "user"}])).unwrap(),
            "ok"
        );
    }

    #[test]
    fn python_methods_tojson_and_str() {
        let src = "{{ messages[0].content.strip().upper() }}|{{ messages[0] | tojson }}|{{ tools }}|{{ add_generation_prompt }}|{{ '\u{1c} x ' | trim }}";
        assert_eq!(
            render(src, serde_json::json!([{"content": " <a&b> ", "n": 1.0}])).unwrap(),
            r#"<A&B>|{"content": " <a&b> ", "n": 1.0}|None|True|x"#
        );
    }

    #[test]
    fn loop_controls_and_generation_tag() {
        let src = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{%- generation -%} {{ m }} {%- endgeneration %}{% endfor %}";
        assert_eq!(render(src, serde_json::json!([1, 2, 3])).unwrap(), "12");
    }

    #[test]
    fn compile_errors_are_load_errors() {
        let err = ChatTemplates::compile(&[("default".into(), "{% if %}".into())]).unwrap_err();
        assert!(
            matches!(err, LoadError::Template { ref name, .. } if name == "default"),
            "{err}"
        );
    }

    #[test]
    fn strftime_formats_utc() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %I%p %%", 1_721_999_109),
            "26 Jul 2024 13:05:09 Friday 208 01PM %"
        );
    }
}
