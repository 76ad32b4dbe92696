//! `axle`: the command line for data scientists and platform teams.

mod policy_cmd;
mod simulate_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "axle", version, about = "Axle: self-service GPUs across clusters and clouds")]
struct Cli {
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policy(cmd) => policy_cmd::run(cmd),
        Command::Simulate(args) => simulate_cmd::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
