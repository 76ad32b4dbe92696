//! The shape of a submit request, checked before anything else looks at
//! it: every string bounded and printable, no NUL anywhere (it cannot
//! reach `execve` or a Kubernetes object), command and environment of a
//! bounded size. Pure: a request in, the first fault out, naming its field.

use axle_proto::api::SubmitRequest;

/// Longest workload, team, class, model, region or key name: a Kubernetes
/// object name (DNS subdomain) is at most 253, and Axle's names become
/// labels and Job names on Kubernetes clusters.
pub const MAX_NAME_CHARS: usize = 253;
/// Most command arguments (program included): far above any real command,
/// well below what `execve` accepts.
pub const MAX_COMMAND_ARGS: usize = 4_096;
/// Most bytes of all command arguments together: Linux's `execve` takes
/// about 2 MiB for arguments and environment; this leaves room for the
/// environment and Axle's own variables.
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;
/// Most environment variables.
pub const MAX_ENV_VARS: usize = 1_024;
/// Longest environment variable name.
pub const MAX_ENV_KEY_BYTES: usize = 256;
/// Most bytes of all environment values together (same `execve` budget).
pub const MAX_ENV_BYTES: usize = 256 * 1024;
/// Longest image reference: registries accept 255 for a repository name
/// plus tag or digest.
pub const MAX_IMAGE_CHARS: usize = 512;
/// Most regions a workload may name.
pub const MAX_REGIONS: usize = 64;

/// Longest `max_runtime_s` and `checkpoint_interval_s` a workload may ask
/// (366 days): far past any real run, and far inside what a clock can add
/// (a run time of 2^64 − 1 s once overflowed a spoke's deadline and stranded
/// the workload's GPUs).
pub const MAX_RUNTIME_S: u64 = 366 * 86_400;

/// A fault in a request's shape: what is wrong, and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    pub message: String,
    pub field: String,
}

fn fault(field: impl Into<String>, message: impl Into<String>) -> ShapeError {
    ShapeError {
        message: message.into(),
        field: field.into(),
    }
}

/// `s` as a person can read it in an error: escaped, at most 40 chars.
fn shown(s: &str) -> String {
    let short: String = s.chars().take(40).collect();
    let more = if s.chars().count() > 40 { "…" } else { "" };
    format!("{}{more}", short.escape_debug())
}

/// A name: non-empty where given, at most `MAX_NAME_CHARS`, no control
/// characters.
fn name(field: &str, s: &str) -> Result<(), ShapeError> {
    let n = s.chars().count();
    if n > MAX_NAME_CHARS {
        return Err(fault(
            field,
            format!("{field} is {n} characters long; at most {MAX_NAME_CHARS} are allowed"),
        ));
    }
    if let Some(c) = axle_policy::text::hidden_char(s) {
        let what = if c.is_control() {
            "the control character"
        } else {
            "the invisible character"
        };
        return Err(fault(
            field,
            format!(
                "{field} \"{}\" contains {what} {}; names are printable text that reads as it is",
                shown(s),
                c.escape_unicode()
            ),
        ));
    }
    Ok(())
}

/// Free text (an argument, a value): no NUL, which no process or API can
/// carry.
fn no_nul(field: &str, s: &str) -> Result<(), ShapeError> {
    if s.contains('\0') {
        return Err(fault(
            field,
            format!(
                "{field} \"{}\" contains a NUL byte, which no program can receive",
                shown(s)
            ),
        ));
    }
    Ok(())
}

/// The first fault in `req`'s shape, if any.
pub fn check(req: &SubmitRequest) -> Result<(), ShapeError> {
    name("team", &req.team)?;
    for (field, v) in [
        ("name", &req.name),
        ("priority", &req.priority),
        ("gpu_model", &req.gpu_model),
        ("idempotency_key", &req.idempotency_key),
        ("checkpoint_signal", &req.checkpoint_signal),
    ] {
        if let Some(v) = v {
            name(field, v)?;
        }
    }
    if req.regions.len() > MAX_REGIONS {
        return Err(fault(
            "regions",
            format!(
                "{} regions named; at most {MAX_REGIONS} are allowed",
                req.regions.len()
            ),
        ));
    }
    for (i, r) in req.regions.iter().enumerate() {
        name(&format!("regions[{i}]"), r)?;
    }
    if let Some(image) = &req.image {
        if image.chars().count() > MAX_IMAGE_CHARS {
            return Err(fault(
                "image",
                format!("image is longer than {MAX_IMAGE_CHARS} characters"),
            ));
        }
        if image.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(fault(
                "image",
                format!(
                    "image \"{}\" contains whitespace or a control character",
                    shown(image)
                ),
            ));
        }
    }
    for (field, v) in [
        ("max_runtime_s", req.max_runtime_s),
        ("checkpoint_interval_s", req.checkpoint_interval_s),
    ] {
        if let Some(s) = v
            && s > MAX_RUNTIME_S
        {
            return Err(fault(
                field,
                format!(
                    "{field} of {s} s is longer than the longest allowed, {MAX_RUNTIME_S} s (366 days)"
                ),
            ));
        }
    }
    if req.command.len() > MAX_COMMAND_ARGS {
        return Err(fault(
            "command",
            format!(
                "command has {} arguments; at most {MAX_COMMAND_ARGS} are allowed",
                req.command.len()
            ),
        ));
    }
    let bytes: usize = req.command.iter().map(String::len).sum();
    if bytes > MAX_COMMAND_BYTES {
        return Err(fault(
            "command",
            format!("command is {bytes} bytes long; at most {MAX_COMMAND_BYTES} are allowed"),
        ));
    }
    for (i, a) in req.command.iter().enumerate() {
        no_nul(&format!("command[{i}]"), a)?;
    }
    if req.env.len() > MAX_ENV_VARS {
        return Err(fault(
            "env",
            format!(
                "env has {} variables; at most {MAX_ENV_VARS} are allowed",
                req.env.len()
            ),
        ));
    }
    let bytes: usize = req.env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_ENV_BYTES {
        return Err(fault(
            "env",
            format!("env is {bytes} bytes long; at most {MAX_ENV_BYTES} are allowed"),
        ));
    }
    for (k, v) in &req.env {
        let field = format!("env.{}", shown(k));
        let valid = !k.is_empty()
            && k.len() <= MAX_ENV_KEY_BYTES
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(fault(
                field,
                format!(
                    "env name \"{}\" is not a variable name: letters, digits and _, not starting with a digit, at most {MAX_ENV_KEY_BYTES} bytes",
                    shown(k)
                ),
            ));
        }
        no_nul(&field, v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> SubmitRequest {
        SubmitRequest {
            team: "vision".into(),
            command: vec!["python".into(), "train.py".into()],
            gpus: 1.0,
            ..Default::default()
        }
    }

    fn field_of(r: SubmitRequest) -> String {
        check(&r).expect_err("refused").field
    }

    #[test]
    fn run_times_are_bounded() {
        // Observed: 18446744073709551615 panicked the spoke's supervisor.
        let mut r = ok();
        r.max_runtime_s = Some(u64::MAX);
        assert_eq!(field_of(r), "max_runtime_s");
        let mut r = ok();
        r.checkpoint_interval_s = Some(MAX_RUNTIME_S + 1);
        assert_eq!(field_of(r), "checkpoint_interval_s");
        let mut r = ok();
        r.max_runtime_s = Some(MAX_RUNTIME_S);
        assert_eq!(check(&r), Ok(()));
    }

    #[test]
    fn an_ordinary_request_passes() {
        let mut r = ok();
        r.name = Some("resnet-50 sweep #3".into());
        r.env.insert("CUDA_LAUNCH_BLOCKING".into(), "1".into());
        r.image = Some("registry.example/axle/runner:1".into());
        assert_eq!(check(&r), Ok(()));
    }

    #[test]
    fn names_are_bounded_and_printable() {
        // Observed: a name of a million characters was accepted at submit.
        let mut r = ok();
        r.name = Some("x".repeat(1_000_000));
        let e = check(&r).unwrap_err();
        assert_eq!(e.field, "name");
        assert!(e.message.contains("1000000 characters"), "{}", e.message);
        let mut r = ok();
        r.name = Some("x".repeat(MAX_NAME_CHARS));
        assert_eq!(check(&r), Ok(()));
        // Observed: `d2\u{200B}-victim` (a zero-width space) and U+202E were
        // accepted and printed so that they looked like other names.
        for bad in ["d2\u{200B}-victim", "abc\u{202E}gpj", "x\u{FEFF}"] {
            let mut r = ok();
            r.name = Some(bad.into());
            let e = check(&r).unwrap_err();
            assert!(e.message.contains("invisible character"), "{}", e.message);
        }
        // Observed: control characters and NUL were accepted.
        for bad in ["a\u{1b}[31mred", "tab\there", "nul\0byte", "new\nline"] {
            let mut r = ok();
            r.name = Some(bad.into());
            let e = check(&r).unwrap_err();
            assert_eq!(e.field, "name", "{bad:?}");
            assert!(e.message.contains("control character"), "{}", e.message);
        }
        let mut r = ok();
        r.team = "vi\0sion".into();
        assert_eq!(field_of(r), "team");
        let mut r = ok();
        r.regions = vec!["eu-west".into(), "us\u{7}".into()];
        assert_eq!(field_of(r), "regions[1]");
    }

    #[test]
    fn nul_is_refused_in_arguments_and_values() {
        // Observed: NUL was accepted at submit and failed later at spawn.
        let mut r = ok();
        r.command.push("--flag=a\0b".into());
        let e = check(&r).unwrap_err();
        assert_eq!(e.field, "command[2]");
        assert!(e.message.contains("NUL"), "{}", e.message);
        let mut r = ok();
        r.env.insert("TOKEN".into(), "a\0b".into());
        assert_eq!(field_of(r), "env.TOKEN");
    }

    #[test]
    fn env_names_are_variable_names() {
        for bad in ["", "1ABC", "A=B", "A B", "ÄRGER", "A\0"] {
            let mut r = ok();
            r.env.insert(bad.into(), "v".into());
            assert!(field_of(r).starts_with("env."), "{bad:?}");
        }
        let mut r = ok();
        r.env.insert("K".repeat(MAX_ENV_KEY_BYTES + 1), "v".into());
        assert!(field_of(r).starts_with("env."));
    }

    #[test]
    fn command_and_env_sizes_are_bounded() {
        let mut r = ok();
        r.command = vec!["x".into(); MAX_COMMAND_ARGS + 1];
        assert_eq!(field_of(r), "command");
        let mut r = ok();
        r.command = vec!["run".into(), "y".repeat(MAX_COMMAND_BYTES)];
        assert_eq!(field_of(r), "command");
        let mut r = ok();
        for i in 0..=MAX_ENV_VARS {
            r.env.insert(format!("V{i}"), String::new());
        }
        assert_eq!(field_of(r), "env");
        let mut r = ok();
        r.env.insert("BIG".into(), "z".repeat(MAX_ENV_BYTES));
        assert_eq!(field_of(r), "env");
        let mut r = ok();
        r.regions = vec!["r".into(); MAX_REGIONS + 1];
        assert_eq!(field_of(r), "regions");
    }

    #[test]
    fn images_have_no_whitespace() {
        let mut r = ok();
        r.image = Some("registry.example/a b:1".into());
        assert_eq!(field_of(r), "image");
        let mut r = ok();
        r.image = Some("i".repeat(MAX_IMAGE_CHARS + 1));
        assert_eq!(field_of(r), "image");
    }
}
