//! Every command the README shows, run as a newcomer would, so the README
//! cannot drift from the code again (observed: the tour's bench stopped
//! after ~200 submits on the dev stack's rate limit, the checkpoint example
//! passed a literal `$AXLE_CHECKPOINT_DIR` and named the wrong workload,
//! `axle completion bash | head -1` panicked).
//!
//! - The tour and the scheduling examples run verbatim, block by block, in
//!   `bash -e` against a real `axle-dev` (the README's own dev stack) on
//!   free loopback ports, with `axle` on `PATH`; every `# workload N
//!   submitted` the README prints must be what the command printed.
//! - The README's load test runs verbatim on a fresh dev stack and must
//!   print its figures (`jobs_per_s=… p99_ms=…`).
//! - `policy check` and the trace replays run verbatim (with the `axle`
//!   the tests built in place of `cargo run --release --bin axle --`).
//! - Commands for real machines (`hub.example.com`, `10.0.0.1`, kubectl)
//!   cannot run here: every flag they use must be one the binary's
//!   `--help` lists, and every file they name must exist.
//! - Stopping the dev stack (SIGINT) removes its temporary data dir.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axle_e2e::{bin, bin_dir, free_port};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// `bash -e -o pipefail -c script` as a README reader runs it: in the
/// repository root, the binaries the tests built first on `PATH`.
fn bash(script: &str) -> Command {
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.args(["-e", "-o", "pipefail", "-c", script])
        .current_dir(root())
        .env("PATH", path);
    cmd
}

/// A fenced `sh` block: its section heading, and its lines with `\`
/// continuations joined and comment-only lines (sample output) kept apart.
#[derive(Debug)]
struct Block {
    section: String,
    /// The script as written (comments included).
    text: String,
    /// `(command, its trailing comment)`, one per logical line.
    commands: Vec<(String, String)>,
    /// The comment lines (sample output).
    output: Vec<String>,
}

fn blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut lines = md.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with('#') && !t.starts_with("#!") {
            section = t.trim_start_matches('#').trim().to_string();
            continue;
        }
        if t != "```sh" {
            continue;
        }
        let mut text = String::new();
        let mut commands = Vec::new();
        let mut output = Vec::new();
        let mut pending = String::new();
        for l in lines.by_ref() {
            let l = l.trim_start();
            if l.starts_with("```") {
                break;
            }
            text.push_str(l);
            text.push('\n');
            if pending.is_empty() && l.starts_with('#') {
                output.push(l.trim_start_matches('#').trim().to_string());
                continue;
            }
            if let Some(cont) = l.strip_suffix('\\') {
                pending.push_str(cont);
                pending.push(' ');
                continue;
            }
            pending.push_str(l);
            let (cmd, comment) = match pending.find("  #") {
                Some(i) => (
                    pending[..i].trim().to_string(),
                    pending[i + 3..].trim().to_string(),
                ),
                None => (pending.trim().to_string(), String::new()),
            };
            if !cmd.is_empty() {
                commands.push((cmd, comment));
            }
            pending.clear();
        }
        out.push(Block {
            section: section.clone(),
            text,
            commands,
            output,
        });
    }
    out
}

/// The inline commands the README shows in backticks after a label, e.g.
/// "Load test: `axle bench submit …`".
fn inline_command(md: &str, label: &str) -> String {
    let at = md
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in README"));
    let rest = &md[at + label.len()..];
    let start = rest.find('`').expect("a command in backticks") + 1;
    let end = start + rest[start..].find('`').expect("closing backtick");
    rest[start..end].to_string()
}

/// The dev stack (`axle-dev`) on free ports, and the token it printed.
struct DevStack {
    child: Child,
    hub: String,
    token: String,
    data_dir: PathBuf,
}

impl DevStack {
    fn start() -> DevStack {
        let (http, grpc) = (free_port(), free_port());
        let mut child = Command::new(bin("axle-dev"))
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(["--grpc", &format!("127.0.0.1:{grpc}")])
            .env_remove("AXLE_DATA_DIR")
            .env_remove("AXLE_POLICY")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start axle-dev");
        let stdout = child.stdout.take().expect("stdout");
        let mut token = None;
        let mut data_dir = None;
        let mut seen = String::new();
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let line = line.expect("axle-dev output");
            if let Some(t) = line.trim().strip_prefix("export AXLE_TOKEN=") {
                token = Some(t.to_string());
            }
            if let Some(i) = line.find("  data ") {
                data_dir = Some(PathBuf::from(line[i + 7..].trim()));
            }
            seen.push_str(&line);
            seen.push('\n');
            if line.trim_start().starts_with("try, in another terminal") {
                break;
            }
        }
        // Keep reading: a stack whose stdout is closed dies at its next line.
        std::thread::spawn(move || for _ in lines {});
        let token = token.unwrap_or_else(|| panic!("axle-dev printed no token:\n{seen}"));
        let data_dir = data_dir.unwrap_or_else(|| panic!("axle-dev printed no data dir:\n{seen}"));
        let stack = DevStack {
            child,
            hub: format!("http://127.0.0.1:{http}"),
            token,
            data_dir,
        };
        stack.wait_ready();
        stack
    }

    /// Both dev spokes Ready.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.sh("axle get clusters -o json");
            let ready = serde_json::from_str::<Vec<axle_proto::api::ClusterView>>(&out.1)
                .is_ok_and(|cs| cs.iter().filter(|c| c.state == "Ready").count() >= 2);
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "dev stack not ready: {out:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `script` in `bash -e` as a README reader would: `axle` on PATH,
    /// AXLE_HUB and AXLE_TOKEN exported, in the repository root.
    fn sh(&self, script: &str) -> (i32, String, String) {
        let out = bash(script)
            .env("AXLE_HUB", &self.hub)
            .env("AXLE_TOKEN", &self.token)
            .env("NO_COLOR", "1")
            .env_remove("AXLE_CA_FILE")
            .output()
            .expect("run bash");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Ctrl-C, as a user stops it; returns once it exited.
    fn stop(mut self) -> PathBuf {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "axle-dev did not stop on SIGINT");
            std::thread::sleep(Duration::from_millis(100));
        }
        self.data_dir.clone()
    }
}

impl Drop for DevStack {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sections whose blocks run on the dev stack, in README order.
const DEV_SECTIONS: &[&str] = &[
    "A five-minute tour",
    "The scheduling model, in one sentence per rule",
    "Checkpoints",
];

#[test]
fn the_tour_runs_as_written_on_the_dev_stack() {
    let md = readme();
    let stack = DevStack::start();
    let mut ran = 0;
    for b in blocks(&md)
        .iter()
        .filter(|b| DEV_SECTIONS.contains(&b.section.as_str()))
    {
        let (code, stdout, stderr) = stack.sh(&b.text);
        assert_eq!(
            code, 0,
            "README block in {:?} failed:\n{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            b.section, b.text
        );
        // What the README says a submit prints is what it printed.
        for o in &b.output {
            if let Some(rest) = o.strip_prefix("workload ")
                && let Some((id, tail)) = rest.split_once(" submitted")
            {
                let want = format!("workload {id} submitted");
                assert!(
                    stdout.lines().any(|l| l.starts_with(&want)),
                    "README says `{o}`; the block printed:\n{stdout}"
                );
                // The state in parentheses too (Placed, Pending).
                let state = tail
                    .trim_start_matches(" (")
                    .split([':', ' ', ')'])
                    .next()
                    .unwrap_or("");
                assert!(
                    stdout
                        .lines()
                        .any(|l| l.starts_with(&format!("{want} ({state}"))),
                    "README says `{o}`; the block printed:\n{stdout}"
                );
            }
        }
        // An inline comment naming what `describe` shows.
        for (cmd, comment) in &b.commands {
            if cmd.starts_with("axle describe workload") && !comment.is_empty() {
                let (_, out, _) = stack.sh(cmd);
                let key = comment.split(':').next().unwrap_or("").trim();
                assert!(
                    out.contains(key),
                    "README says `{cmd}` shows `{comment}`; it printed:\n{out}"
                );
            }
        }
        ran += 1;
    }
    assert!(
        ran >= 4,
        "only {ran} tour blocks found: the README changed shape"
    );
    let data_dir = stack.stop();
    assert!(
        !data_dir.exists(),
        "axle-dev left {} behind after Ctrl-C",
        data_dir.display()
    );
}

#[test]
fn the_readme_load_test_runs_as_written_on_the_dev_stack() {
    let cmd = inline_command(&readme(), "Load test: ");
    assert!(cmd.starts_with("axle bench submit"), "{cmd}");
    let stack = DevStack::start();
    let (code, stdout, stderr) = stack.sh(&cmd);
    assert_eq!(code, 0, "`{cmd}` failed:\n{stdout}\n{stderr}");
    // The figures, for the README and the closing notes.
    eprintln!("{cmd}\n{stdout}");
    for key in ["jobs_per_s=", "p50_ms=", "p99_ms=", "submitted="] {
        assert!(stdout.contains(key), "no {key} in:\n{stdout}");
    }
}

/// `cargo run --release --bin axle --` as the `axle` the tests built.
fn as_built(cmd: &str) -> String {
    cmd.replace("cargo run --release --bin axle --", "axle")
}

#[test]
fn policy_check_and_the_trace_replays_run_as_written() {
    let md = readme();
    let mut ran = 0;
    for b in blocks(&md)
        .iter()
        .filter(|b| b.section == "Check a policy repository" || b.section == "Replay a GPU trace")
    {
        let script = as_built(&b.text);
        let out = bash(&script).output().expect("run bash");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "README block in {:?} failed:\n{script}\n{stdout}\n{}",
            b.section,
            String::from_utf8_lossy(&out.stderr)
        );
        for o in &b.output {
            if let Some(head) = o.strip_suffix('…') {
                assert!(stdout.contains(head), "README says `{o}`; got:\n{stdout}");
            }
        }
        ran += 1;
    }
    assert!(ran >= 3, "only {ran} blocks: the README changed shape");
}

/// The flags `bin [subcommands] --help` lists.
fn help_flags(bin_name: &str, sub: &[&str]) -> BTreeSet<String> {
    let out = Command::new(bin(bin_name))
        .args(sub)
        .arg("--help")
        .output()
        .expect("run --help");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| w.starts_with("--"))
        .map(|w| w.split(['=', '<']).next().unwrap_or(w).to_string())
        .collect()
}

#[test]
fn commands_for_real_machines_use_only_flags_that_exist() {
    let md = readme();
    let mut checked = 0;
    for b in blocks(&md)
        .iter()
        .filter(|b| !DEV_SECTIONS.contains(&b.section.as_str()))
        .filter(|b| b.section != "Check a policy repository" && b.section != "Replay a GPU trace")
    {
        for (cmd, _) in &b.commands {
            let words: Vec<&str> = cmd.split_whitespace().collect();
            let Some(&first) = words.first() else {
                continue;
            };
            match first {
                "axle" | "axle-hub" | "axle-spoke" => {
                    // The subcommand path: every word that extends it (a
                    // placeholder, a path or a flag's value does not).
                    let mut sub: Vec<&str> = Vec::new();
                    for w in &words[1..] {
                        if w.starts_with('-') || w.contains(['/', '.', ':', '…', '>']) {
                            continue;
                        }
                        let mut try_sub = sub.clone();
                        try_sub.push(w);
                        let out = Command::new(bin(first))
                            .args(&try_sub)
                            .arg("--help")
                            .output()
                            .expect("run --help");
                        if out.status.success() {
                            sub = try_sub;
                        }
                    }
                    let mut known = help_flags(first, &sub);
                    known.extend(help_flags(first, &[]));
                    for w in &words[1..] {
                        let flag = w.split('=').next().unwrap_or(w).trim_start_matches('[');
                        if flag.starts_with("--") && !known.contains(flag) {
                            panic!(
                                "README runs `{cmd}`, but `{first} {} --help` lists no {flag}",
                                sub.join(" ")
                            );
                        }
                    }
                    checked += 1;
                }
                "./scripts/dev.sh" | "./scripts/test.sh" | "deploy/kind-up.sh" => {
                    let path = root().join(first.trim_start_matches("./"));
                    let ok = Command::new("bash")
                        .arg("-n")
                        .arg(&path)
                        .status()
                        .is_ok_and(|s| s.success());
                    assert!(ok, "{} is missing or not valid bash", path.display());
                    checked += 1;
                }
                "kubectl" => {
                    // `kubectl apply -k DIR`: the overlay renders (the
                    // deploy tests check its objects).
                    let dir = words.last().expect("a directory");
                    assert!(
                        root().join(dir).join("kustomization.yaml").exists(),
                        "{cmd}"
                    );
                    checked += 1;
                }
                other => panic!(
                    "README block in {:?} runs `{other}`, which no test covers",
                    b.section
                ),
            }
        }
    }
    assert!(checked >= 8, "only {checked} commands checked");
}

#[test]
fn completion_survives_a_reader_that_leaves() {
    // The README's `axle completion bash` piped to `head -1`.
    let out = Command::new("bash")
        .args(["-o", "pipefail", "-c"])
        .arg(format!(
            "{} completion bash | head -1",
            bin("axle").display()
        ))
        .output()
        .expect("run bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).is_empty());
}

#[test]
fn docs_cite_only_files_the_repository_has() {
    // Observed: ARCHITECTURE.md and code comments cited `DESIGN.md
    // invariant 3` and `DEPENDENCIES.md`, which a clone does not contain.
    let out = Command::new("git")
        .args(["ls-files"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    let files = String::from_utf8_lossy(&out.stdout);
    let mut cited = Vec::new();
    for f in files.lines() {
        if !(f.ends_with(".rs")
            || f.ends_with(".md")
            || f.ends_with(".toml")
            || f.ends_with(".yaml"))
        {
            continue;
        }
        if f == "tests/e2e/readme.rs" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root().join(f)) else {
            continue;
        };
        for name in ["DESIGN.md", "DEPENDENCIES.md", "STYLE.md"] {
            if text.contains(name) && !root().join(name).exists() {
                cited.push(format!("{f} cites {name}"));
            }
        }
    }
    assert!(cited.is_empty(), "{cited:#?}");
}
