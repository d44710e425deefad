//! Markdown and command-line text as `readme.rs` reads them: sections, fenced blocks, inline
//! code spans, `kvroute-sim` commands, shell words and synopsis flags.

/// A `## ` section: its heading line and its lines.
pub struct Section {
    pub heading: String,
    pub lines: Vec<String>,
}

pub fn sections(md: &str) -> Vec<Section> {
    let mut out = vec![Section {
        heading: String::new(),
        lines: vec![],
    }];
    for line in md.lines() {
        if line.starts_with("## ") {
            out.push(Section {
                heading: line.to_owned(),
                lines: vec![],
            });
        } else {
            out.last_mut().unwrap().lines.push(line.to_owned());
        }
    }
    out
}

/// The section of `md` whose heading line is `heading` (panics naming it when there is none).
pub fn section(md: &str, heading: &str) -> Section {
    sections(md)
        .into_iter()
        .find(|s| s.heading == heading)
        .unwrap_or_else(|| panic!("no section {heading:?}"))
}

/// The subcommand a heading is about: "## `kvroute-sim serve`" → serve.
pub fn heading_subcommand(heading: &str) -> Option<String> {
    let rest = heading.strip_prefix("## `kvroute-sim ")?;
    Some(rest.split(['`', ' ']).next()?.to_owned())
}

/// The subcommands "## Engine flags (study, bar, run, serve)" names.
pub fn engine_heading_subcommands(heading: &str) -> Option<Vec<String>> {
    let rest = heading.strip_prefix("## Engine flags (")?;
    let list = rest.strip_suffix(')')?;
    Some(list.split(',').map(|s| s.trim().to_owned()).collect())
}

/// The section's fenced code blocks (their lines) and the rest (fences blanked).
pub fn split_fences(lines: &[String]) -> (Vec<Vec<String>>, Vec<String>) {
    let mut blocks = vec![];
    let mut prose = vec![];
    let mut block: Option<Vec<String>> = None;
    for line in lines {
        if line.trim_start().starts_with("```") {
            match block.take() {
                Some(b) => blocks.push(b),
                None => block = Some(vec![]),
            }
            prose.push(String::new());
        } else if let Some(b) = &mut block {
            b.push(line.clone());
            prose.push(String::new());
        } else {
            prose.push(line.clone());
        }
    }
    assert!(block.is_none(), "unclosed code block");
    (blocks, prose)
}

/// Inline code spans, by paragraph (spans may wrap lines; a newline becomes a space).
pub fn spans_by_paragraph(prose: &[String]) -> Vec<Vec<String>> {
    let mut out = vec![];
    for para in prose.join("\n").split("\n\n") {
        let spans: Vec<String> = para
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|s| s.replace('\n', " "))
            .collect();
        out.push(spans);
    }
    out
}

/// A `kvroute-sim SUB ...` command of a code block: the subcommand and the rest, continuation
/// lines joined.
#[derive(Debug, Clone)]
pub struct BlockCommand {
    pub sub: String,
    pub rest: String,
    /// The line as written (the first line of it).
    pub line: String,
}

impl BlockCommand {
    /// A synopsis shows optional parts in brackets; a runnable example does not.
    pub fn is_synopsis(&self) -> bool {
        self.rest.contains('[')
    }
}

pub fn block_commands(block: &[String]) -> Vec<BlockCommand> {
    let mut out: Vec<BlockCommand> = vec![];
    let mut open = false;
    for line in block {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("kvroute-sim ") {
            let rest = rest.trim_start();
            let (sub, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            out.push(BlockCommand {
                sub: sub.to_owned(),
                rest: rest.to_owned(),
                line: t.to_owned(),
            });
            open = true;
        } else if open && line.starts_with(' ') && (t.starts_with('[') || t.starts_with("--")) {
            let c = out.last_mut().unwrap();
            c.rest.push(' ');
            c.rest.push_str(t);
        } else {
            open = false;
        }
    }
    out
}

/// Strips a trailing `# comment` (outside quotes) from a line.
pub fn strip_comment(s: &str) -> &str {
    let mut quote = None;
    let mut prev_space = true;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if prev_space => return &s[..i],
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    s
}

/// Splits a command as a POSIX shell splits these examples: whitespace, '…' and "…" quotes, a
/// `#` comment.
pub fn shell_words(s: &str) -> Vec<String> {
    let s = strip_comment(s);
    let mut words = vec![];
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    assert!(quote.is_none(), "unbalanced quotes in {s:?}");
    if in_word {
        words.push(cur);
    }
    words
}

/// The option a word names: `--rate` → rate, `--variant,` → variant; `--fault-*` (a family)
/// and other words → None.
pub fn flag_name(word: &str) -> Option<String> {
    let rest = word.strip_prefix("--")?;
    let end = rest
        .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    let (name, tail) = rest.split_at(end);
    let ok_tail = tail.chars().all(|c| ",.;:)".contains(c));
    (!name.is_empty() && !name.ends_with('-') && ok_tail).then(|| name.to_owned())
}

/// A placeholder (`N`, `FILE.jsonl`, `http://HOST:PORT`), a choice (`1|2`), `...` or prose,
/// not a value to pass as written.
pub fn is_placeholder(word: &str) -> bool {
    word.chars().any(|c| c.is_ascii_uppercase())
        || word.contains('|')
        || word.contains("..")
        || word.contains('…')
        || word.starts_with('(')
        || word.ends_with(',')
}

/// The flags of a synopsis (or a flag list such as the engine flags') and the default each
/// shows, if any: `(X)` after its placeholder, or a literal value (`[--max-num-seqs 8]`). A
/// flag's words are those after it inside the same brackets.
pub fn synopsis_flags(s: &str) -> Vec<(String, Option<String>)> {
    let s = strip_comment(s);
    // (word, bracket group)
    let mut words: Vec<(String, usize)> = vec![];
    let mut group = 0;
    let mut cur = String::new();
    let flush = |cur: &mut String, group: usize, words: &mut Vec<(String, usize)>| {
        if !cur.is_empty() {
            words.push((std::mem::take(cur), group));
        }
    };
    for c in s.chars() {
        match c {
            '[' | ']' => {
                flush(&mut cur, group, &mut words);
                group += 1;
            }
            c if c.is_whitespace() => flush(&mut cur, group, &mut words),
            c => cur.push(c),
        }
    }
    flush(&mut cur, group, &mut words);
    let mut out = vec![];
    for (i, (w, g)) in words.iter().enumerate() {
        let Some(name) = flag_name(w) else {
            continue;
        };
        let values: Vec<&str> = words[i + 1..]
            .iter()
            .take_while(|(v, vg)| vg == g && flag_name(v).is_none())
            .map(|(v, _)| v.as_str())
            .collect();
        let default = values
            .iter()
            .find_map(|v| v.strip_prefix('(')?.strip_suffix(')'))
            .map(str::to_owned)
            .or_else(|| {
                let first = values.first()?;
                (!is_placeholder(first)).then(|| first.to_string())
            });
        out.push((name, default));
    }
    out
}

pub fn same_value(a: &str, b: &str) -> bool {
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
