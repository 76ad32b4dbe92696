//! `axle`: the command line for data scientists and platform teams.
//!
//! Offline commands (`policy`, `simulate`) run the policy and scheduler
//! crates directly; hub commands (`submit`, `get`, `describe`, `cancel`,
//! `logs`, `bench`) talk to the hub's HTTP API (`--hub`, `$AXLE_HUB`).
//!
//! Exit codes scripts can rely on (see [`exit`]):
//! 0 success; 1 the hub refused the request (4xx) or a workload/bench failed;
//! 2 usage error; 3 cannot reach the hub or the hub failed (5xx).

mod args;
mod auth_cmd;
mod bench_cmd;
mod bench_soak;
mod burst_cmd;
mod client;
mod describe;
mod exit;
mod get_cmd;
mod layout;
mod logs_cmd;
mod policy_cmd;
mod simulate_cmd;
mod simulate_fill;
mod simulate_matrix;
mod table;
mod workload_cmd;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Where `axle` looks for the hub when neither `--hub` nor `$AXLE_HUB` is set.
const DEFAULT_HUB: &str = "http://127.0.0.1:7070";

#[derive(Parser)]
#[command(
    name = "axle",
    version,
    about = "Axle: self-service GPUs across clusters and clouds",
    after_help = exit::HELP
)]
struct Cli {
    // The three connection flags read their environment variables after
    // parsing (`from_env`), not through clap's `env`: clap lists every
    // argument it matched, environment included, in a usage error's
    // `Usage:` line, so a mistyped `submit` showed `--hub <HUB> --ca-file
    // <CA_FILE> --token <TOKEN>` the user never typed.
    /// Hub URL for commands that talk to the hub [env: AXLE_HUB] [default: http://127.0.0.1:7070].
    #[arg(long, global = true)]
    hub: Option<String>,
    /// PEM CA certificate(s) to trust for an https:// hub, besides the system's [env: AXLE_CA_FILE].
    #[arg(long, global = true)]
    ca_file: Option<std::path::PathBuf>,
    /// API token (default: the one `axle login` saved) [env: AXLE_TOKEN].
    #[arg(long, global = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a policy repository or print the policy JSON Schema.
    #[command(subcommand)]
    Policy(policy_cmd::PolicyCommand),
    /// Replay a GPU job trace through the scheduler on a simulated clock.
    Simulate(simulate_cmd::SimulateArgs),
    /// Submit a workload: `axle submit --team T --gpus 0.5 -- python train.py`.
    Submit(workload_cmd::SubmitArgs),
    /// List workloads, clusters, teams, events, hub replicas or burst instances.
    Get(get_cmd::GetArgs),
    /// Show one object in detail.
    #[command(subcommand)]
    Describe(workload_cmd::DescribeCommand),
    /// Cancel a workload.
    Cancel(workload_cmd::CancelArgs),
    /// Print a workload's output.
    Logs(logs_cmd::LogsArgs),
    /// Load generators against a running hub.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCommand),
    /// Save an API token for the hub (checked first) in ~/.config/axle/config.yaml.
    Login(auth_cmd::LoginArgs),
    /// Who the hub takes you for, and your roles.
    Whoami,
    /// API tokens (platform admins).
    #[command(subcommand)]
    Token(auth_cmd::TokenCommand),
    /// Join and revoke clusters' spokes (platform admins).
    #[command(subcommand)]
    Cluster(auth_cmd::ClusterCommand),
    /// Print a shell completion script: `source <(axle completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `axle … | head -1`: once the reader is gone, the rest of the output has
/// nowhere to go. Rust reports that as a panic in `println!`; Axle exits
/// quietly instead, as Unix tools do (status 0: the reader chose to stop).
fn exit_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// Writes `bytes` to stdout; a reader that left is no error (see
/// [`exit_quietly_on_broken_pipe`]).
fn write_stdout(bytes: &[u8]) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            ExitCode::from(exit::USAGE)
        }
    }
}

fn main() -> ExitCode {
    exit_quietly_on_broken_pipe();
    let cli = Cli::parse();
    match cli.command {
        Command::Completion { shell } => {
            // Written whole at the end: clap_complete panics on a write
            // error of its own (a reader that left, `| head -1`).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "axle", &mut script);
            write_stdout(&script)
        }
        Command::Policy(cmd) => offline(policy_cmd::run(cmd)),
        Command::Simulate(args) => offline(simulate_cmd::run(args)),
        command => {
            // reqwest is built with `rustls-no-provider`: install one before
            // any client exists, or building it panics.
            client::install_crypto_provider();
            let hub = cli
                .hub
                .or_else(|| env_value("AXLE_HUB"))
                .unwrap_or_else(|| DEFAULT_HUB.to_string());
            let ca_file = cli
                .ca_file
                .or_else(|| env_value("AXLE_CA_FILE").map(Into::into));
            let token = cli.token.or_else(|| env_value("AXLE_TOKEN"));
            match run_hub_command(&hub, ca_file.as_deref(), token, command) {
                Ok(code) => code,
                Err(e) => {
                    let (code, lines) = exit::classify(&e);
                    for line in lines {
                        eprintln!("{line}");
                    }
                    ExitCode::from(code)
                }
            }
        }
    }
}

/// An environment variable's value, when set and not empty.
fn env_value(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

/// Errors of the offline commands keep their historical exit code 2.
fn offline(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit::USAGE)
        }
    }
}

fn run_hub_command(
    hub: &str,
    ca_file: Option<&std::path::Path>,
    token: Option<String>,
    command: Command,
) -> anyhow::Result<ExitCode> {
    let ca = match ca_file {
        Some(p) => Some(std::fs::read(p).map_err(|e| {
            exit::UsageError(format!("--ca-file {}: cannot read it: {e}", p.display()))
        })?),
        None => None,
    };
    let token = match token.filter(|t| !t.is_empty()) {
        Some(t) => Some(t),
        None => auth_cmd::load_config()
            .map_err(|e| exit::UsageError(format!("{e:#}")))?
            .and_then(|c| c.token),
    };
    let client = client::Client::with_ca(hub, ca.as_deref())
        .map_err(|e| exit::UsageError(format!("{e:#}")))?
        .with_token(token);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match command {
            Command::Submit(a) => workload_cmd::submit(&client, a).await,
            Command::Get(a) => get_cmd::run(&client, a).await,
            Command::Describe(c) => workload_cmd::describe(&client, c).await,
            Command::Cancel(a) => workload_cmd::cancel(&client, a).await,
            Command::Logs(a) => logs_cmd::logs(&client, a).await,
            Command::Bench(c) => bench_cmd::run(&client, c).await,
            Command::Login(a) => auth_cmd::login(&client, hub, a).await,
            Command::Whoami => auth_cmd::whoami(&client).await,
            Command::Token(c) => auth_cmd::token(&client, c).await,
            Command::Cluster(c) => auth_cmd::cluster(&client, c).await,
            Command::Policy(_) | Command::Simulate(_) | Command::Completion { .. } => {
                unreachable!("offline commands are dispatched in main")
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_documents_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        for line in ["0  success", "2  usage error", "3  cannot reach the hub"] {
            assert!(help.contains(line), "{line:?} missing from --help");
        }
    }

    #[test]
    fn bad_ids_are_usage_errors() {
        let err = Cli::try_parse_from(["axle", "describe", "workload", "abc"])
            .err()
            .expect("abc is not an id");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("workload id must be a number"));
    }

    #[test]
    fn submit_takes_the_command_after_dashes() {
        let cli = Cli::try_parse_from([
            "axle",
            "submit",
            "--team",
            "vision",
            "--gpus",
            "0.25",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--max-runtime",
            "1h30m",
            "--region",
            "us",
            "--region",
            "eu",
            "--",
            "python",
            "train.py",
            "--epochs",
            "3",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let Command::Submit(_) = cli.command else {
            panic!("not submit")
        };
        assert!(
            Cli::try_parse_from(["axle", "submit", "--team", "t", "--gpus", "1"]).is_err(),
            "a command is required"
        );
        let bad = Cli::try_parse_from([
            "axle",
            "submit",
            "--team",
            "t",
            "--gpus",
            "1",
            "--max-runtime",
            "soon",
            "--",
            "x",
        ]);
        assert_eq!(bad.err().map(|e| e.exit_code()), Some(2));
    }

    #[test]
    fn get_and_bench_parse() {
        for argv in [
            &[
                "axle",
                "get",
                "workloads",
                "-o",
                "yaml",
                "--state",
                "running",
            ][..],
            &["axle", "get", "wl", "-w", "--team", "vision"],
            &["axle", "get", "clusters", "-o", "json"],
            &["axle", "get", "teams"],
            &["axle", "--hub", "http://h:1", "logs", "3", "-f"],
            &["axle", "cancel", "9"],
            &[
                "axle", "bench", "submit", "--jobs", "100", "--gpus", "0.25", "--", "true",
            ],
        ] {
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("{argv:?}: {e}");
            }
        }
        assert!(Cli::try_parse_from(["axle", "get", "nodes"]).is_err());
        assert!(
            Cli::try_parse_from([
                "axle", "bench", "submit", "--jobs", "0", "--gpus", "1", "--", "true"
            ])
            .is_err()
        );
    }
}
