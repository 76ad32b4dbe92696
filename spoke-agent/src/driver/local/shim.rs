//! The process shim that ties every workload replica's life to the spoke's.
//!
//! The spoke starts each replica as
//! `<spoke exe> __axle_shim <grace_s> [--signal SIGUSR1] [--lease-ms N] -- <command…>`
//! in a new process group, with stdin a pipe whose write end only the spoke
//! holds. When the spoke dies for any reason (even SIGKILL), the kernel closes
//! that pipe; the shim sees EOF and takes the whole group down (SIGTERM, then
//! SIGKILL after the grace period), so a workload never outlives its spoke and
//! never runs twice after the hub re-queues it elsewhere. With `--lease-ms`,
//! the spoke also writes a byte at least every N ms while the hub confirms
//! it (`lease.rs`); silence for N ms — a hung spoke (SIGSTOP), or one the hub
//! no longer confirms — takes the group down the same way. This needs no
//! unsafe code: no `pre_exec`, no `prctl(PR_SET_PDEATHSIG)`.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::getpgrp;
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{SignalKind, signal};

/// The first argument that turns the spoke executable into the shim.
pub const SHIM_ARG: &str = "__axle_shim";
/// Exit code when the shim itself is misused or cannot set up (like `env`'s 125).
pub const SHIM_SETUP_EXIT_CODE: i32 = 125;
/// Exit code when the command cannot be executed (the shell's convention).
pub const SHIM_EXEC_FAILED_EXIT_CODE: i32 = 127;
/// Exit code base for a command killed by a signal (the shell's convention: 128 + signal).
pub const SIGNAL_EXIT_BASE: i32 = 128;
/// Stdin read buffer; the spoke never writes, so any size works.
const STDIN_BUF_BYTES: usize = 64;
/// The shim's first output, before the command exists: tells the spoke the
/// SIGTERM handler is in place, so a stop can no longer kill the shim itself
/// (the spoke strips it from the log). Until then the spoke holds back
/// STARTED and any stop.
pub const SHIM_READY_MARKER: &[u8] = b"axle-shim: ready\n";

/// If this process was started as the shim (`argv[1] == "__axle_shim"`), runs
/// the shim and exits the process; otherwise returns at once. Call it first
/// thing in every `main` that may host a spoke (`axle-spoke`, `axle-hub --dev`).
pub fn maybe_run_shim() {
    // args_os: `std::env::args` panics on a non-UTF-8 argument, and this runs
    // first thing in every spoke-hosting binary, whatever its arguments.
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SHIM_ARG)) {
        return;
    }
    // The spoke only passes proto strings (UTF-8) here.
    let rest: Option<Vec<String>> = args.map(|a| a.into_string().ok()).collect();
    let parsed = rest
        .ok_or_else(|| "arguments must be UTF-8".to_string())
        .and_then(|rest| ShimArgs::parse(&rest));
    let code = match parsed {
        Ok(shim_args) => run_shim_blocking(shim_args),
        Err(message) => {
            eprintln!("axle-shim: {message}");
            SHIM_SETUP_EXIT_CODE
        }
    };
    std::process::exit(code);
}

#[derive(Debug, PartialEq, Eq)]
struct ShimArgs {
    grace: Duration,
    /// What the group gets when the spoke is gone: the workload's checkpoint
    /// signal, else SIGTERM.
    stop_signal: Signal,
    /// Longest silence on stdin before the shim acts as if the spoke were gone.
    lease: Option<Duration>,
    command: Vec<String>,
}

impl ShimArgs {
    /// `<grace_s> [--signal <SIG>] [--lease-ms <N>] -- <command…>`
    fn parse(args: &[String]) -> Result<ShimArgs, String> {
        let usage =
            "usage: __axle_shim <grace_s> [--signal SIGNAL] [--lease-ms N] -- <command> [args…]";
        let [grace_text, rest @ ..] = args else {
            return Err(usage.into());
        };
        let mut rest: &[String] = rest;
        let mut stop_signal = Signal::SIGTERM;
        let mut lease = None;
        loop {
            match rest {
                [flag, sig, more @ ..] if flag == "--signal" => {
                    let sig: Signal = sig
                        .parse()
                        .map_err(|_| format!("unknown signal {sig:?}; {usage}"))?;
                    if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
                        return Err(format!("{sig} cannot be caught; {usage}"));
                    }
                    stop_signal = sig;
                    rest = more;
                }
                [flag, ms, more @ ..] if flag == "--lease-ms" => {
                    let ms: u64 = ms.parse().ok().filter(|&ms| ms > 0).ok_or_else(|| {
                        format!("--lease-ms {ms:?} is not a positive number; {usage}")
                    })?;
                    lease = Some(Duration::from_millis(ms));
                    rest = more;
                }
                _ => break,
            }
        }
        let [dashes, command @ ..] = rest else {
            return Err(usage.into());
        };
        if dashes != "--" || command.is_empty() {
            return Err(usage.into());
        }
        let grace_s: u64 = grace_text
            .parse()
            .map_err(|_| format!("grace {grace_text:?} is not a number of seconds; {usage}"))?;
        Ok(ShimArgs {
            grace: Duration::from_secs(grace_s),
            stop_signal,
            lease,
            command: command.to_vec(),
        })
    }
}

fn run_shim_blocking(args: ShimArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("axle-shim: cannot start runtime: {e}");
            return SHIM_SETUP_EXIT_CODE;
        }
    };
    let code = runtime.block_on(run_shim(args));
    // The stdin reader sits in a blocking read that never returns; a plain
    // drop of the runtime would wait for it forever.
    runtime.shutdown_background();
    code
}

async fn run_shim(args: ShimArgs) -> i32 {
    // Catching SIGTERM (and doing nothing) keeps the shim alive when the spoke
    // signals the group: the child gets the signal, the shim stays to report
    // its exit code. A caught signal resets to default in the exec'd child,
    // unlike an ignored one, so the workload still sees SIGTERM normally.
    let mut sigterm = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("axle-shim: cannot handle SIGTERM: {e}");
            return SHIM_SETUP_EXIT_CODE;
        }
    };
    // The same for the workload's own stop signal (its checkpoint signal),
    // which would otherwise kill the shim by default.
    let mut stop_sig = match signal(SignalKind::from_raw(args.stop_signal as i32)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("axle-shim: cannot handle {}: {e}", args.stop_signal);
            return SHIM_SETUP_EXIT_CODE;
        }
    };
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        if stdout
            .write_all(SHIM_READY_MARKER)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            // Nobody reads our output: the spoke is already gone.
            return SHIM_SETUP_EXIT_CODE;
        }
    }
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return SHIM_SETUP_EXIT_CODE,
    };
    // The workload's output goes through the shim rather than straight to
    // the spoke's pipes: when the spoke dies, writes to those pipes fail, and
    // a workload writing its checkpoint messages in its grace period must
    // not die of SIGPIPE. The relay keeps reading and drops what it cannot pass on.
    let mut child = match tokio::process::Command::new(program)
        .args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("axle-shim: cannot run {program:?}: {e}");
            return SHIM_EXEC_FAILED_EXIT_CODE;
        }
    };
    let relays = [
        child
            .stdout
            .take()
            .map(|r| tokio::spawn(relay(r, tokio::io::stdout()))),
        child
            .stderr
            .take()
            .map(|r| tokio::spawn(relay(r, tokio::io::stderr()))),
    ];
    let mut stdin = tokio::io::stdin();
    let lease = args.lease;
    let stdin_closed = async move {
        let mut buf = [0u8; STDIN_BUF_BYTES];
        loop {
            let read = stdin.read(&mut buf);
            let got = match lease {
                Some(ttl) => match tokio::time::timeout(ttl, read).await {
                    Ok(r) => r,
                    Err(_) => {
                        eprintln!(
                            "axle-shim: no word from the spoke for {} ms (hung, or the hub no \
                             longer confirms it); stopping the workload",
                            ttl.as_millis()
                        );
                        return;
                    }
                },
                None => read.await,
            };
            match got {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::pin!(stdin_closed);
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(status) => exit_code_of(status),
                    Err(e) => {
                        eprintln!("axle-shim: cannot wait for {program:?}: {e}");
                        SHIM_SETUP_EXIT_CODE
                    }
                };
                // Background processes the command left in the group must not
                // outlive it; the shim itself shrugs off this SIGTERM.
                let _ = killpg(getpgrp(), Signal::SIGTERM);
                // Pass on the last output (bounded: a leftover process may
                // hold the pipes open a little longer).
                for r in relays.into_iter().flatten() {
                    let _ = tokio::time::timeout(RELAY_DRAIN_TIMEOUT, r).await;
                }
                return code;
            }
            _ = sigterm.recv() => {
                // Sent to the whole group by the spoke; the child handles it.
            }
            _ = stop_sig.recv() => {}
            () = &mut stdin_closed => {
                // The spoke is gone: take the group down, letting the
                // workload save its progress first.
                let _ = killpg(getpgrp(), args.stop_signal);
                let _ = tokio::time::timeout(args.grace, child.wait()).await;
                // Kills the shim too, which is what we want: nobody waits for it.
                let _ = killpg(getpgrp(), Signal::SIGKILL);
                return SHIM_SETUP_EXIT_CODE;
            }
        }
    }
}

/// How long the shim waits, after the command exits, for the last output
/// to pass through the relay.
const RELAY_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Relay buffer: one pipe's worth.
const RELAY_BUF_BYTES: usize = 64 * 1024;

/// Copies the workload's output to the shim's own, until the workload closes
/// it. Once a write fails (the spoke is gone), keeps reading and discards, so
/// the workload never blocks or gets SIGPIPE.
async fn relay(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
) {
    use tokio::io::AsyncWriteExt as _;
    let mut buf = vec![0u8; RELAY_BUF_BYTES];
    let mut open = true;
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if open && (to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err()) {
                    open = false;
                }
            }
        }
    }
}

fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => SIGNAL_EXIT_BASE + sig,
        (None, None) => SHIM_SETUP_EXIT_CODE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_shim_args() {
        assert_eq!(
            ShimArgs::parse(&strings(&["5", "--", "sh", "-c", "true"])),
            Ok(ShimArgs {
                grace: Duration::from_secs(5),
                stop_signal: Signal::SIGTERM,
                lease: None,
                command: strings(&["sh", "-c", "true"])
            })
        );
        assert_eq!(
            ShimArgs::parse(&strings(&[
                "0",
                "--lease-ms",
                "1500",
                "--signal",
                "SIGUSR1",
                "--",
                "run"
            ])),
            Ok(ShimArgs {
                grace: Duration::ZERO,
                stop_signal: Signal::SIGUSR1,
                lease: Some(Duration::from_millis(1500)),
                command: strings(&["run"])
            })
        );
        assert!(ShimArgs::parse(&strings(&["5", "--lease-ms", "0", "--", "run"])).is_err());
        assert_eq!(
            ShimArgs::parse(&strings(&["5", "--signal", "SIGUSR1", "--", "run"])),
            Ok(ShimArgs {
                grace: Duration::from_secs(5),
                stop_signal: Signal::SIGUSR1,
                lease: None,
                command: strings(&["run"])
            })
        );
        assert!(ShimArgs::parse(&strings(&["5", "--signal", "SIGKILL", "--", "run"])).is_err());
        assert!(ShimArgs::parse(&strings(&["5", "--signal", "SIGNOPE", "--", "run"])).is_err());
        for bad in [
            &["5", "--"][..],
            &["5", "sh"][..],
            &["x", "--", "sh"][..],
            &[][..],
        ] {
            assert!(ShimArgs::parse(&strings(bad)).is_err(), "{bad:?}");
        }
    }
}
