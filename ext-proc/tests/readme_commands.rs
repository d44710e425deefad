//! The READMEs' shell commands, run as written, so that a newcomer can follow them to the letter.
//!
//! - ext-proc/README.md's "Quick start": its ```sh block is read from the README at run time
//!   and run as one bash script (`bash -e`). The build lines (`make envoy`, `cargo build ...`)
//!   run from the repository's root; the rest runs from a temporary directory holding what it
//!   needs under the same relative paths (copies of `envoy/kvroute.example.toml` and
//!   `envoy/envoy.yaml`, `target/debug` and `.venv/bin/envoy` linked to the binaries under
//!   test), with every fixed port (the configuration's, the rendering's and the commands')
//!   rewritten to a free one chosen at run time and a private `--base-id` for Envoy. The test
//!   checks the completion (200, routed, the decision header), `/debug/decisions` and
//!   `/metrics` in what the commands printed, and that the processes they started are gone
//!   when the commands end (none left in the script's process group, every port closed).
//! - envoy-module/README.md's "Quick start", the same way (Envoy with `envoy/envoy.module.yaml`
//!   and the module from `target/debug`).
//! - envoy/README.md: the re-rendering command (into a temporary file, compared with the
//!   shipped `envoy/envoy.yaml`) and `.venv/bin/envoy --mode validate`.
//! - README.md's "The two commands": `make demo` runs scripts/demo-envoy.sh after a release
//!   build; the script runs here with the debug build to its end, and interrupted as Ctrl-C
//!   does (SIGINT to its whole process group), and nothing it started may be left.
//!
//! Those that need Envoy are `#[ignore]`d in the plain workspace run and run by
//! `make test-e2e`; without Envoy they fail, never skip. Every process runs under a deadline
//! and in a process group of its own, killed if a test fails.

mod support;

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use support::{envoy_bin, ext_proc_bin, sim_bin, TempDir};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The ```sh blocks of `text`, in order; each as its lines, with `\` continuations joined.
fn sh_blocks(text: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if line.trim_end() == "```sh" => current = Some(Vec::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.push(current.take().unwrap()),
            Some(b) => match b.last_mut() {
                Some(last) if last.ends_with('\\') => {
                    last.pop();
                    last.push_str(line.trim_start());
                }
                _ => b.push(line.to_owned()),
            },
        }
    }
    assert!(current.is_none(), "unterminated ```sh block");
    blocks
}

/// The text of the section under the heading line `heading` (up to the next heading of the
/// same or a higher level outside code blocks).
fn section(text: &str, heading: &str) -> String {
    let level = heading.bytes().take_while(|&b| b == b'#').count();
    let mut lines = text.lines().skip_while(|l| l.trim_end() != heading);
    assert!(lines.next().is_some(), "no heading {heading:?}");
    let mut fenced = false;
    let mut out = String::new();
    for line in lines {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let hashes = line.bytes().take_while(|&b| b == b'#').count();
        if !fenced && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Whether `text` has `n` as a number of its own (no digit on either side).
fn has_number(text: &str, n: u16) -> bool {
    let n = n.to_string();
    text.match_indices(&n).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + n.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_digit()) && !after.is_some_and(|c| c.is_ascii_digit())
    })
}

/// Replaces `prefix{old}` (not followed by a digit) with `prefix{new}`.
fn replace_port(text: &str, prefix: &str, old: u16, new: &str) -> String {
    let pat = format!("{prefix}{old}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(&pat) {
        let after = &rest[i + pat.len()..];
        out.push_str(&rest[..i]);
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            out.push_str(&pat);
        } else {
            out.push_str(prefix);
            out.push_str(new);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Every number after `prefix` in `text`.
fn ports_after(text: &str, prefix: &str) -> Vec<u16> {
    text.match_indices(prefix)
        .filter_map(|(i, _)| {
            let digits: String = text[i + prefix.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

/// `n` distinct free ports on 127.0.0.1 (held together, then released).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// The live (not zombie) processes of process group `pgid`, as "pid command line".
fn group_members(pgid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        let Some((_, after)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push(format!("{pid} {}", cmdline.trim_end()));
        }
    }
    found
}

/// A command run as the leader of a process group of its own (as a shell runs a job), with
/// stdout and stderr in files. On drop, whatever is left of the group is killed.
struct Job {
    name: String,
    child: Child,
    pgid: u32,
    out: PathBuf,
    err: PathBuf,
}

impl Job {
    fn spawn(name: &str, mut cmd: Command, dir: &TempDir) -> Job {
        let out = dir.path(&format!("{name}.out"));
        let err = dir.path(&format!("{name}.err"));
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .process_group(0);
        // A user's shell: no proxy between curl and loopback, no routing settings from the
        // environment (they override the example configuration's).
        // Nor what cargo sets for this test (support::cargo says why).
        support::cargo::remove_test_env(&mut cmd);
        for (k, _) in std::env::vars() {
            let lower = k.to_ascii_lowercase();
            if lower.ends_with("_proxy") || k.starts_with("AIBRIX_") || k == "ROUTING_ALGORITHM" {
                cmd.env_remove(&k);
            }
        }
        // The make running `make test` must not leak its jobserver into the commands' make.
        for k in ["MAKEFLAGS", "MFLAGS", "MAKELEVEL"] {
            cmd.env_remove(k);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let pgid = child.id();
        Job {
            name: name.to_owned(),
            child,
            pgid,
            out,
            err,
        }
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Its stdout and stderr, for failure messages.
    fn output(&self) -> String {
        format!(
            "--- {} stdout:\n{}\n--- {} stderr:\n{}",
            self.name,
            self.stdout(),
            self.name,
            std::fs::read_to_string(&self.err).unwrap_or_default()
        )
    }

    /// Waits for the leader's exit; panics (the group is killed on drop) after `timeout`.
    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                panic!(
                    "{} still running after {timeout:?}:\n{}",
                    self.name,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (`timeout` at most) for a stdout line starting with `prefix`.
    fn wait_line(&mut self, prefix: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.stdout().lines().any(|l| l.starts_with(prefix)) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before printing {prefix:?}:\n{}",
                    self.name,
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} printed no {prefix:?} within {timeout:?}:\n{}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `sig` to the whole process group, as a terminal sends Ctrl-C's SIGINT.
    fn signal_group(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), "--", &format!("-{}", self.pgid)])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{sig} -{} failed", self.pgid);
    }

    /// Asserts that nothing of the group is running any more.
    fn assert_group_gone(&self) {
        let left = group_members(self.pgid);
        assert!(
            left.is_empty(),
            "{} left processes running:\n{}\n{}",
            self.name,
            left.join("\n"),
            self.output()
        );
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !group_members(self.pgid).is_empty() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.pgid)])
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `line` with `bash -e -c` from the repository's root, within `timeout`.
fn run_in_root(line: &str, dir: &TempDir, name: &str, timeout: Duration) -> Job {
    eprintln!("$ {line}");
    let mut cmd = Command::new("bash");
    cmd.args(["-e", "-c", line]).current_dir(root());
    let mut job = Job::spawn(name, cmd, dir);
    let status = job.wait(timeout);
    assert!(
        status.success(),
        "`{line}` failed ({status}):\n{}",
        job.output()
    );
    job
}

/// The Quick start's commands in README `readme`: the build lines (first) and the rest.
fn quick_start(readme_path: &str) -> (Vec<String>, Vec<String>) {
    let readme = read(readme_path);
    let blocks = sh_blocks(&section(&readme, "## Quick start"));
    assert_eq!(
        blocks.len(),
        1,
        "{readme_path}'s Quick start must have one ```sh block (this test runs it)"
    );
    let lines: Vec<String> = blocks[0]
        .iter()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .cloned()
        .collect();
    let is_build = |l: &String| l.starts_with("make ") || l.starts_with("cargo ");
    let build: Vec<String> = lines.iter().take_while(|l| is_build(l)).cloned().collect();
    let rest: Vec<String> = lines[build.len()..].to_vec();
    assert!(
        !rest.iter().any(is_build),
        "{readme_path}: the build lines (make, cargo) must come first: they run from the \
         repository's root, the rest from a temporary directory"
    );
    (build, rest)
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn ext_proc_quick_start_runs_as_written() {
    run_quick_start("ext-proc/README.md", "envoy/envoy.yaml");
}

/// The same for kvroute inside Envoy (the module reads the TOML file Envoy's filter config
/// names, relative to Envoy's working directory: the copy here).
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn envoy_module_quick_start_runs_as_written() {
    run_quick_start("envoy-module/README.md", "envoy/envoy.module.yaml");
}

/// Runs the Quick start of README `readme_path`, whose Envoy configuration is `yaml_rel`
/// (rendered from `envoy/kvroute.example.toml`), and checks what it printed and left.
fn run_quick_start(readme_path: &str, yaml_rel: &str) {
    let dir = TempDir::new("readme-quick-start");
    let envoy = std::fs::canonicalize(envoy_bin()).expect("ENVOY_BIN");
    let bin_dir = ext_proc_bin().parent().unwrap().to_path_buf();
    let (build, session) = quick_start(readme_path);
    assert!(
        !build.is_empty() && !session.is_empty(),
        "{readme_path}: no build or run lines"
    );

    // The build lines, as written, from the repository's root.
    for (i, line) in build.iter().enumerate() {
        run_in_root(line, &dir, &format!("build-{i}"), Duration::from_secs(900));
    }

    // The fixed ports: the configuration's addresses and the rendering's port values.
    let toml = read("envoy/kvroute.example.toml");
    let yaml = read(yaml_rel);
    let mut old: Vec<u16> = ports_after(&toml, "127.0.0.1:");
    old.extend(ports_after(&yaml, "port_value: "));
    old.sort_unstable();
    old.dedup();
    assert!(old.len() >= 5, "ports found: {old:?}");
    let new = free_ports(old.len());
    let mut script = session.join("\n") + "\n";
    let (mut toml2, mut yaml2) = (toml.clone(), yaml.clone());
    // Two passes through placeholders, so that a new port equal to an old one is not
    // rewritten twice.
    for (i, &p) in old.iter().enumerate() {
        let ph = format!("@PORT{i}@");
        toml2 = replace_port(&toml2, "127.0.0.1:", p, &ph);
        yaml2 = replace_port(&yaml2, "port_value: ", p, &ph);
        script = replace_port(&script, ":", p, &ph);
        script = replace_port(&script, "--port ", p, &ph);
    }
    for (name, text) in [
        ("envoy/kvroute.example.toml", &toml2),
        (yaml_rel, &yaml2),
        ("the Quick start", &script),
    ] {
        for &p in &old {
            assert!(
                !has_number(text, p),
                "{name}: port {p} left after rewriting (teach this test its form)"
            );
        }
    }
    for (i, p) in new.iter().enumerate() {
        let (ph, p) = (format!("@PORT{i}@"), p.to_string());
        toml2 = toml2.replace(&ph, &p);
        yaml2 = yaml2.replace(&ph, &p);
        script = script.replace(&ph, &p);
    }
    // Envoy's shared-memory id, private to this run (another Envoy may use the default 0).
    let envoy_cmd = ".venv/bin/envoy ";
    assert_eq!(
        script.matches(envoy_cmd).count(),
        1,
        "{readme_path}: expected one `{envoy_cmd}` command"
    );
    // Apart from support's 20,000-120,009, and from the other Quick start this process runs
    // at the same time (two Envoys on one base id: the second cannot bind its domain socket).
    static QUICK_STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nth = QUICK_STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
    let base_id = 200_000 + (std::process::id() % 10_000) * 10 + nth;
    script = script.replace(envoy_cmd, &format!("{envoy_cmd}--base-id {base_id} "));

    // The temporary directory: what the commands use, under the same relative paths.
    let work = dir.path("checkout");
    std::fs::create_dir_all(work.join("envoy")).unwrap();
    std::fs::create_dir_all(work.join("target")).unwrap();
    std::fs::create_dir_all(work.join(".venv/bin")).unwrap();
    std::fs::write(work.join("envoy/kvroute.example.toml"), &toml2).unwrap();
    std::fs::write(work.join(yaml_rel), &yaml2).unwrap();
    std::os::unix::fs::symlink(&bin_dir, work.join("target/debug")).unwrap();
    std::os::unix::fs::symlink(&envoy, work.join(".venv/bin/envoy")).unwrap();
    let script_path = dir.path("quick-start.sh");
    std::fs::write(&script_path, &script).unwrap();
    eprintln!("--- the Quick start, from {}:\n{script}---", work.display());

    let mut cmd = Command::new("bash");
    cmd.arg("-e").arg(&script_path).current_dir(&work);
    let mut job = Job::spawn("quick-start", cmd, &dir);
    let status = job.wait(Duration::from_secs(120));
    let out = job.stdout();
    let all = job.output();
    eprintln!("{all}");
    assert!(status.success(), "the Quick start failed ({status})");

    // Nothing the commands started is left: no process of the script's group, no port open.
    job.assert_group_gone();
    for p in &new {
        match TcpStream::connect_timeout(
            &format!("127.0.0.1:{p}").parse().unwrap(),
            Duration::from_secs(1),
        ) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
            other => panic!("port {p} still answers after the Quick start: {other:?}"),
        }
    }

    // The completion: 200 through Envoy, routed by kvroute to the replica that answered.
    let header = |name: &str| -> String {
        out.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("no {name} header in the output"))
    };
    assert!(
        out.lines().any(|l| l.trim_end() == "HTTP/1.1 200 OK"),
        "no 200"
    );
    let replica = header("x-kvroute-sim-replica");
    let decision = header("x-kvroute-decision");
    assert!(
        decision.starts_with("strategy=prefix-cache ")
            && decision.contains(&format!(" pod={replica} ")),
        "decision {decision:?}, answered by {replica}"
    );
    assert_eq!(header("target-pod"), replica);
    assert_eq!(header("server"), "envoy");
    // /debug/decisions lists it; /metrics counted it for that pod, once.
    assert!(
        out.contains(&format!("\"decision\": \"{decision}\"")),
        "/debug/decisions does not show {decision:?}"
    );
    let routed: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("kvroute_pod_routed_total{"))
        .collect();
    assert_eq!(routed.len(), 2, "{routed:?}");
    assert!(
        routed.iter().any(|l| l
            .starts_with(&format!("kvroute_pod_routed_total{{pod=\"{replica}\","))
            && l.ends_with(" 1")),
        "{routed:?}"
    );
}

#[test]
fn envoy_readme_render_commands_reproduce_the_shipped_files() {
    let readme = read("envoy/README.md");
    let blocks = sh_blocks(&readme);
    assert_eq!(
        blocks.len(),
        1,
        "envoy/README.md: a new ```sh block is run by no test: add it to tests/readme_commands.rs"
    );
    let shipped = ["envoy/envoy.yaml", "envoy/envoy.module.yaml"];
    assert_eq!(blocks[0].len(), shipped.len(), "{:?}", blocks[0]);
    let dir = TempDir::new("readme-render");
    for (i, (line, file)) in blocks[0].iter().zip(shipped).enumerate() {
        let target = format!(" > {file}");
        assert!(
            line.starts_with("cargo run ") && line.ends_with(&target),
            "envoy/README.md's render command for {file} changed: {line}"
        );
        let out = dir.path(&format!("rendered-{i}.yaml"));
        let line = line.replace(&target, &format!(" > {}", out.display()));
        run_in_root(
            &line,
            &dir,
            &format!("render-{i}"),
            Duration::from_secs(900),
        );
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(root().join(file)).unwrap(),
            "envoy/README.md's command does not render {file} as shipped (diff {} {file})",
            out.display()
        );
    }
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn envoy_readme_validate_command() {
    let cmd = ".venv/bin/envoy --mode validate -c envoy/envoy.yaml";
    assert!(
        read("envoy/README.md").contains(&format!("`{cmd}`")),
        "envoy/README.md no longer shows `{cmd}`: update this test"
    );
    let envoy = std::fs::canonicalize(envoy_bin()).expect("ENVOY_BIN");
    let line = cmd.replace(".venv/bin/envoy", &envoy.display().to_string());
    let dir = TempDir::new("readme-validate");
    let job = run_in_root(&line, &dir, "validate", Duration::from_secs(120));
    assert!(job.output().contains("OK"), "{}", job.output());
}

#[test]
fn top_readme_commands_are_known() {
    let readme = read("README.md");
    let commands: Vec<String> = sh_blocks(&readme)
        .concat()
        .iter()
        .map(|l| l.split('#').next().unwrap().trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    // make demo: its script is run below; make test: the suite itself.
    assert_eq!(
        commands,
        ["make demo", "make test"],
        "README.md's commands changed: make sure a test runs each"
    );
}

/// scripts/demo-envoy.sh (what `make demo` runs after its release build), with the debug
/// binaries, Envoy and TMPDIR in `dir`, in a process group of its own and with SIGINT at its
/// default disposition (as in a terminal, whatever the test runner inherited).
fn demo(dir: &TempDir, env: &[(&str, &str)], args: &[&str]) -> Job {
    sim_bin();
    let bin_dir = ext_proc_bin().parent().unwrap().to_path_buf();
    assert!(bin_dir.join("kvroute-sim").exists());
    let tmp = dir.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut cmd = Command::new("env");
    cmd.args(["--default-signal=INT", "bash"])
        .arg(root().join("scripts/demo-envoy.sh"))
        .args(args)
        .current_dir(root())
        .env(
            "ENVOY_BIN",
            std::fs::canonicalize(envoy_bin()).expect("ENVOY_BIN"),
        )
        .env("KVROUTE_BIN_DIR", &bin_dir)
        .env("TMPDIR", &tmp)
        .env_remove("REQUESTS")
        .env_remove("SPEEDUP");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Job::spawn("demo", cmd, dir)
}

/// The demo's temporary directory is gone.
fn assert_tmp_empty(dir: &TempDir) {
    let left: Vec<_> = std::fs::read_dir(dir.path("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "the demo left {left:?}");
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn demo_stops_everything_at_its_end() {
    let dir = TempDir::new("readme-demo-end");
    let mut job = demo(&dir, &[("REQUESTS", "8"), ("SPEEDUP", "20")], &[]);
    let status = job.wait(Duration::from_secs(180));
    assert!(
        status.success(),
        "the demo failed ({status}):\n{}",
        job.output()
    );
    let out = job.stdout();
    assert_eq!(
        out.matches("reasons (x-kvroute-decision)").count(),
        3,
        "{}",
        job.output()
    );
    assert!(out.contains("kvroute-ext-proc counters after the run:"));
    job.assert_group_gone();
    assert_tmp_empty(&dir);
}

/// `make demo DEMO_ARGS=--module`: the same replay through kvroute inside Envoy.
#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn demo_through_the_module_stops_everything_at_its_end() {
    let dir = TempDir::new("readme-demo-module");
    support::cargo::build(&["kvroute-envoy", "kvroute-sim"]);
    let mut job = demo(&dir, &[("REQUESTS", "8"), ("SPEEDUP", "20")], &["--module"]);
    let status = job.wait(Duration::from_secs(180));
    assert!(
        status.success(),
        "the demo failed ({status}):\n{}",
        job.output()
    );
    let out = job.stdout();
    assert!(out.contains("kvroute inside Envoy: admin=http://"), "{out}");
    assert_eq!(
        out.matches("reasons (x-kvroute-decision)").count(),
        3,
        "{}",
        job.output()
    );
    assert!(out.contains("kvroute (module in Envoy) counters after the run:"));
    assert!(
        out.lines()
            .any(|l| l.starts_with("kvroute_pod_routed_total{")),
        "{out}"
    );
    job.assert_group_gone();
    assert_tmp_empty(&dir);
}

#[test]
#[ignore = "needs Envoy; run by `make test-e2e`"]
fn demo_stops_everything_on_ctrl_c() {
    let dir = TempDir::new("readme-demo-int");
    // make demo's own request count and speed: the replay is still running when interrupted.
    let mut job = demo(&dir, &[], &[]);
    // Interrupted while the replay runs (its output comes in bursts: wait for the process).
    job.wait_line("envoy: http://", Duration::from_secs(60));
    let running = support::wait_for(Duration::from_secs(30), || {
        let members = group_members(job.pgid);
        members
            .iter()
            .any(|m| m.contains("kvroute-sim replay"))
            .then_some(members)
    })
    .unwrap_or_else(|| panic!("the replay did not start:\n{}", job.output()));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(running.len(), 6, "not all running:\n{}", running.join("\n"));
    let t = Instant::now();
    job.signal_group("INT");
    let status = job.wait(Duration::from_secs(30));
    eprintln!("the demo exited {:?} after Ctrl-C", t.elapsed());
    assert_eq!(status.code(), Some(130), "{}", job.output());
    job.assert_group_gone();
    assert_tmp_empty(&dir);
}
